//! The results of `ggml-tp bench`: one [`Record`] per (setup, test), written as a markdown table
//! (`-o md`, like llama-bench's), a JSON array (`-o json`) or CSV (`-o csv`), with the field names
//! of llama-bench's JSON output (`model_filename`, `n_prompt`, `n_gen`, `n_depth`, `avg_ts`, ...).

use serde::Serialize;

/// How `bench` writes its results.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// A markdown table, a row as each test ends.
    #[default]
    Md,
    /// One JSON array of records at the end.
    Json,
    /// A header line, then a line per test as it ends.
    Csv,
}

/// One test of one setup, with llama-bench's field names.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Record {
    /// The model file name without `.gguf`, or `synthetic PRESET`.
    pub model_filename: String,
    /// Bytes of the model file (or the synthetic image).
    pub model_size: u64,
    /// `none`, `layer` or `tensor`.
    pub split_mode: String,
    /// The devices of the setup, comma-separated.
    pub devices: String,
    pub n_threads: usize,
    /// Prompt tokens of a pp test (0 for tg).
    pub n_prompt: usize,
    /// Generated tokens of a tg test (0 for pp).
    pub n_gen: usize,
    /// Tokens already in the cache when the test starts.
    pub n_depth: usize,
    /// The prompt's micro-batch (0: the whole prompt in one pass).
    pub n_ubatch: usize,
    /// Nanoseconds of each repetition.
    pub samples_ns: Vec<u64>,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
}

impl Record {
    /// A record of `tokens` tokens per repetition taking `seconds` each.
    pub fn new(setup: SetupFields, test: TestShape, tokens: usize, seconds: &[f64]) -> Record {
        let samples_ns: Vec<u64> = seconds.iter().map(|s| (s * 1e9) as u64).collect();
        let samples_ts: Vec<f64> = seconds.iter().map(|s| tokens as f64 / s).collect();
        let (avg_s, std_s) = mean_std(seconds);
        let (avg_ts, stddev_ts) = mean_std(&samples_ts);
        Record {
            model_filename: setup.model_filename,
            model_size: setup.model_size,
            split_mode: setup.split_mode,
            devices: setup.devices,
            n_threads: setup.n_threads,
            n_prompt: test.n_prompt,
            n_gen: test.n_gen,
            n_depth: test.n_depth,
            n_ubatch: test.n_ubatch,
            samples_ns,
            samples_ts,
            avg_ns: (avg_s * 1e9) as u64,
            stddev_ns: (std_s * 1e9) as u64,
            avg_ts,
            stddev_ts,
        }
    }

    /// The test's name as llama-bench writes it: `pp512`, `tg128`, `pp2048 ub512`, `tg128 @ d4096`.
    pub fn test_name(&self) -> String {
        let mut name = if self.n_gen > 0 {
            format!("tg{}", self.n_gen)
        } else {
            format!("pp{}", self.n_prompt)
        };
        if self.n_gen == 0 && self.n_ubatch > 0 && self.n_ubatch < self.n_prompt {
            name.push_str(&format!(" ub{}", self.n_ubatch));
        }
        if self.n_depth > 0 {
            name.push_str(&format!(" @ d{}", self.n_depth));
        }
        name
    }
}

/// What a record says of its setup.
#[derive(Clone, Debug)]
pub struct SetupFields {
    pub model_filename: String,
    pub model_size: u64,
    pub split_mode: String,
    pub devices: String,
    pub n_threads: usize,
}

/// What a record says of its test.
#[derive(Clone, Copy, Debug, Default)]
pub struct TestShape {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    pub n_ubatch: usize,
}

/// Mean and sample standard deviation.
fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Writes records in one format: the header first, each record as it comes, the rest at the end.
pub struct Report {
    format: Format,
    records: Vec<Record>,
}

/// The CSV columns (the scalar fields of [`Record`]; the samples are joined by `;`).
const CSV_FIELDS: [&str; 15] = [
    "model_filename",
    "model_size",
    "split_mode",
    "devices",
    "n_threads",
    "n_prompt",
    "n_gen",
    "n_depth",
    "n_ubatch",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
];

impl Report {
    /// A report in `format`, its header printed.
    pub fn start(format: Format) -> Report {
        match format {
            Format::Md => {
                println!("| model | size | split | devices | threads | test | t/s |");
                println!("| --- | ---: | --- | --- | ---: | ---: | ---: |");
            }
            Format::Csv => println!("{}", CSV_FIELDS.join(",")),
            Format::Json => {}
        }
        Report {
            format,
            records: Vec::new(),
        }
    }

    /// Adds a record (printed now in md and csv).
    pub fn add(&mut self, r: Record) {
        match self.format {
            Format::Md => println!("{}", markdown_row(&r)),
            Format::Csv => println!("{}", csv_row(&r)),
            Format::Json => {}
        }
        self.records.push(r);
    }

    /// Prints what is left (the JSON array).
    pub fn finish(self) {
        if self.format == Format::Json {
            let text = serde_json::to_string_pretty(&self.records).unwrap_or_else(|_| "[]".into());
            println!("{text}");
        }
    }
}

fn markdown_row(r: &Record) -> String {
    format!(
        "| {} | {:.1} MiB | {} | {} | {} | {} | {:.2} ± {:.2} |",
        r.model_filename,
        r.model_size as f64 / (1 << 20) as f64,
        r.split_mode,
        r.devices,
        r.n_threads,
        r.test_name(),
        r.avg_ts,
        r.stddev_ts
    )
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv_row(r: &Record) -> String {
    let join = |xs: Vec<String>| xs.join(";");
    [
        csv_field(&r.model_filename),
        r.model_size.to_string(),
        csv_field(&r.split_mode),
        csv_field(&r.devices),
        r.n_threads.to_string(),
        r.n_prompt.to_string(),
        r.n_gen.to_string(),
        r.n_depth.to_string(),
        r.n_ubatch.to_string(),
        r.avg_ns.to_string(),
        r.stddev_ns.to_string(),
        format!("{:.6}", r.avg_ts),
        format!("{:.6}", r.stddev_ts),
        join(r.samples_ns.iter().map(u64::to_string).collect()),
        join(r.samples_ts.iter().map(|t| format!("{t:.6}")).collect()),
    ]
    .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(test: TestShape) -> Record {
        let setup = SetupFields {
            model_filename: "m,1".into(),
            model_size: 3 << 20,
            split_mode: "tensor".into(),
            devices: "cpu:0,cpu:1".into(),
            n_threads: 2,
        };
        Record::new(setup, test, 100, &[0.5, 0.25])
    }

    #[test]
    fn names_rates_and_rows() {
        let tg = record(TestShape {
            n_gen: 100,
            n_depth: 4096,
            ..TestShape::default()
        });
        assert_eq!(tg.test_name(), "tg100 @ d4096");
        assert_eq!(tg.samples_ts, vec![200.0, 400.0]);
        assert_eq!(tg.avg_ts, 300.0);
        assert_eq!(tg.avg_ns, 375_000_000);
        let pp = record(TestShape {
            n_prompt: 2048,
            n_ubatch: 512,
            ..TestShape::default()
        });
        assert_eq!(pp.test_name(), "pp2048 ub512");
        assert!(markdown_row(&pp).contains("| tensor | cpu:0,cpu:1 | 2 | pp2048 ub512 | 300.00 ±"));
        let csv = csv_row(&pp);
        assert!(csv.starts_with("\"m,1\",3145728,tensor,\"cpu:0,cpu:1\",2,2048,0,0,512,"));
        assert_eq!(csv.split(',').count(), CSV_FIELDS.len() + 2);
        let json: serde_json::Value = serde_json::to_value(&pp).unwrap();
        assert_eq!(json["n_prompt"], 2048);
        assert_eq!(json["samples_ts"][1], 400.0);
    }
}
