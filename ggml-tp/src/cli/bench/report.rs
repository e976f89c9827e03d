//! The results of `ggml-tp bench`: one [`Record`] per (setup, test), written as a markdown table
//! (`-o md`, like llama-bench's), a JSON array (`-o json`), JSON lines (`-o jsonl`) or CSV
//! (`-o csv`), with llama-bench's field names and order (`build_commit`, `model_filename`,
//! `n_prompt`, `n_gen`, `n_depth`, `test_time`, `avg_ts`, `stddev_ts`, `samples_ts`, ...). Fields of
//! llama.cpp's own options that ggml-tp has no counterpart of (`n_gpu_layers`, `flash_attn`,
//! `cpu_mask`, ...) are left out; `devices` and `tensor_split` are `/`-separated as there.

use serde::Serialize;
use std::time::{SystemTime, UNIX_EPOCH};

/// How `bench` writes its results.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// A markdown table, a row as each test ends.
    #[default]
    Md,
    /// One JSON array of records at the end.
    Json,
    /// One JSON object per line, as each test ends.
    Jsonl,
    /// A header line, then a line per test as it ends (every value quoted, no samples).
    Csv,
}

/// What a record says of its setup: the build, the machine, the model and its placement.
#[derive(Clone, Debug, Default)]
pub struct SetupFields {
    pub build_commit: String,
    pub build_number: u64,
    pub cpu_info: String,
    pub gpu_info: String,
    pub backends: String,
    /// The model file as given, or `synthetic PRESET`.
    pub model_filename: String,
    /// Architecture, parameter count and main weight type, e.g. `llama 135M Q4_1`.
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub n_threads: usize,
    pub type_k: String,
    pub type_v: String,
    /// `none`, `layer` or `tensor`.
    pub split_mode: String,
    /// The devices, `/`-separated.
    pub devices: String,
    /// The shares of the devices, `/`-separated (`0.00`: equal shares).
    pub tensor_split: String,
}

/// What a record says of its test.
#[derive(Clone, Copy, Debug, Default)]
pub struct TestShape {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    /// Tokens per forward pass of the prompt (and of the fill to the depth).
    pub n_ubatch: usize,
    /// True when the micro-batch was asked for (`-u`) and so belongs in the test's name.
    pub ubatch_given: bool,
}

/// One test of one setup, in llama-bench's field names and order.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Record {
    pub build_commit: String,
    pub build_number: u64,
    pub cpu_info: String,
    pub gpu_info: String,
    pub backends: String,
    pub model_filename: String,
    pub model_type: String,
    /// Bytes of the model file (or the synthetic image).
    pub model_size: u64,
    pub model_n_params: u64,
    /// The largest batch of one forward pass (ggml-tp has no separate logical batch: `n_ubatch`).
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub n_threads: usize,
    pub type_k: String,
    pub type_v: String,
    pub split_mode: String,
    pub devices: String,
    pub tensor_split: String,
    /// Prompt tokens of a pp test (0 for tg).
    pub n_prompt: usize,
    /// Generated tokens of a tg test (0 for pp).
    pub n_gen: usize,
    /// Tokens already in the cache when the test starts.
    pub n_depth: usize,
    /// When the test ended, UTC (`2026-12-01T23:40:00Z`).
    pub test_time: String,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    /// Nanoseconds of each repetition.
    pub samples_ns: Vec<u64>,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    #[serde(skip)]
    ubatch_given: bool,
}

impl Record {
    /// A record of `tokens` tokens per repetition taking `seconds` each, ended at `test_time`.
    pub fn new(
        setup: SetupFields,
        test: TestShape,
        tokens: usize,
        seconds: &[f64],
        test_time: String,
    ) -> Record {
        let samples_ns: Vec<u64> = seconds.iter().map(|s| (s * 1e9) as u64).collect();
        let samples_ts: Vec<f64> = seconds.iter().map(|s| tokens as f64 / s).collect();
        let (avg_s, std_s) = mean_std(seconds);
        let (avg_ts, stddev_ts) = mean_std(&samples_ts);
        Record {
            build_commit: setup.build_commit,
            build_number: setup.build_number,
            cpu_info: setup.cpu_info,
            gpu_info: setup.gpu_info,
            backends: setup.backends,
            model_filename: setup.model_filename,
            model_type: setup.model_type,
            model_size: setup.model_size,
            model_n_params: setup.model_n_params,
            n_batch: test.n_ubatch,
            n_ubatch: test.n_ubatch,
            n_threads: setup.n_threads,
            type_k: setup.type_k,
            type_v: setup.type_v,
            split_mode: setup.split_mode,
            devices: setup.devices,
            tensor_split: setup.tensor_split,
            n_prompt: test.n_prompt,
            n_gen: test.n_gen,
            n_depth: test.n_depth,
            test_time,
            avg_ns: (avg_s * 1e9) as u64,
            stddev_ns: (std_s * 1e9) as u64,
            avg_ts,
            stddev_ts,
            samples_ns,
            samples_ts,
            ubatch_given: test.ubatch_given,
        }
    }

    /// The test's name as llama-bench writes it: `pp512`, `tg128`, `pp2048 ub512`, `tg128 @ d4096`.
    pub fn test_name(&self) -> String {
        let mut name = if self.n_gen > 0 {
            format!("tg{}", self.n_gen)
        } else {
            format!("pp{}", self.n_prompt)
        };
        if self.n_gen == 0 && self.ubatch_given && self.n_ubatch < self.n_prompt {
            name.push_str(&format!(" ub{}", self.n_ubatch));
        }
        if self.n_depth > 0 {
            name.push_str(&format!(" @ d{}", self.n_depth));
        }
        name
    }

    /// The scalar fields in order, as text (the CSV columns: everything but the samples).
    fn scalars(&self) -> [(&'static str, String); 25] {
        [
            ("build_commit", self.build_commit.clone()),
            ("build_number", self.build_number.to_string()),
            ("cpu_info", self.cpu_info.clone()),
            ("gpu_info", self.gpu_info.clone()),
            ("backends", self.backends.clone()),
            ("model_filename", self.model_filename.clone()),
            ("model_type", self.model_type.clone()),
            ("model_size", self.model_size.to_string()),
            ("model_n_params", self.model_n_params.to_string()),
            ("n_batch", self.n_batch.to_string()),
            ("n_ubatch", self.n_ubatch.to_string()),
            ("n_threads", self.n_threads.to_string()),
            ("type_k", self.type_k.clone()),
            ("type_v", self.type_v.clone()),
            ("split_mode", self.split_mode.clone()),
            ("devices", self.devices.clone()),
            ("tensor_split", self.tensor_split.clone()),
            ("n_prompt", self.n_prompt.to_string()),
            ("n_gen", self.n_gen.to_string()),
            ("n_depth", self.n_depth.to_string()),
            ("test_time", self.test_time.clone()),
            ("avg_ns", self.avg_ns.to_string()),
            ("stddev_ns", self.stddev_ns.to_string()),
            ("avg_ts", format!("{:.6}", self.avg_ts)),
            ("stddev_ts", format!("{:.6}", self.stddev_ts)),
        ]
    }

    /// The model's name for the table: the file name without its folder and `.gguf`.
    fn model_name(&self) -> &str {
        let base = self.model_filename.rsplit('/').next().unwrap_or_default();
        base.strip_suffix(".gguf").unwrap_or(base)
    }
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

/// `t` as UTC in ISO 8601 to the second, as llama-bench's `test_time`.
pub fn utc_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), in 400-year eras.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Writes records in one format: the header first, each record as it comes, the rest at the end.
pub struct Report {
    format: Format,
    records: Vec<Record>,
}

impl Report {
    /// A report in `format`, its header printed (CSV's after the first record, which names the
    /// columns).
    pub fn start(format: Format) -> Report {
        if format == Format::Md {
            println!(
                "| model | size | params | backend | split | devices | threads | test | t/s |"
            );
            println!("| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: |");
        }
        Report {
            format,
            records: Vec::new(),
        }
    }

    /// Adds a record (printed now in md, jsonl and csv).
    pub fn add(&mut self, r: Record) {
        match self.format {
            Format::Md => println!("{}", markdown_row(&r)),
            Format::Jsonl => println!("{}", serde_json::to_string(&r).unwrap_or_default()),
            Format::Csv => {
                if self.records.is_empty() {
                    println!("{}", csv_header(&r));
                }
                println!("{}", csv_row(&r));
            }
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

/// Parameters as llama-bench's table writes them: `135.00 M`, `8.03 B`.
fn params_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.2} M", n as f64 / 1e6)
    }
}

fn markdown_row(r: &Record) -> String {
    format!(
        "| {} | {:.1} MiB | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} |",
        r.model_name(),
        r.model_size as f64 / (1 << 20) as f64,
        params_label(r.model_n_params),
        r.backends,
        r.split_mode,
        r.devices,
        r.n_threads,
        r.test_name(),
        r.avg_ts,
        r.stddev_ts
    )
}

/// A CSV value, quoted as llama-bench quotes every value (inner quotes doubled).
fn csv_quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn csv_header(r: &Record) -> String {
    let names: Vec<&str> = r.scalars().iter().map(|(name, _)| *name).collect();
    names.join(",")
}

fn csv_row(r: &Record) -> String {
    let values: Vec<String> = r.scalars().iter().map(|(_, v)| csv_quoted(v)).collect();
    values.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn record(test: TestShape) -> Record {
        let setup = SetupFields {
            build_commit: "abc1234".into(),
            build_number: 7,
            cpu_info: "Some \"Fast\" CPU".into(),
            backends: "CPU".into(),
            model_filename: "models/m,1.gguf".into(),
            model_type: "llama 135M Q4_1".into(),
            model_size: 3 << 20,
            model_n_params: 134_515_008,
            n_threads: 2,
            type_k: "f16".into(),
            type_v: "f16".into(),
            split_mode: "tensor".into(),
            devices: "cpu:0/cpu:1".into(),
            tensor_split: "0.00".into(),
            ..SetupFields::default()
        };
        Record::new(
            setup,
            test,
            100,
            &[0.5, 0.25],
            "2026-12-01T23:40:00Z".into(),
        )
    }

    #[test]
    fn names_rates_and_rows() {
        let tg = record(TestShape {
            n_gen: 100,
            n_depth: 4096,
            n_ubatch: 512,
            ..TestShape::default()
        });
        assert_eq!(tg.test_name(), "tg100 @ d4096");
        assert_eq!(tg.samples_ts, vec![200.0, 400.0]);
        assert_eq!(tg.avg_ts, 300.0);
        assert_eq!(tg.avg_ns, 375_000_000);
        let pp = record(TestShape {
            n_prompt: 2048,
            n_ubatch: 512,
            ubatch_given: true,
            ..TestShape::default()
        });
        assert_eq!(pp.test_name(), "pp2048 ub512");
        let whole = record(TestShape {
            n_prompt: 512,
            n_ubatch: 512,
            ..TestShape::default()
        });
        assert_eq!(whole.test_name(), "pp512");
        let row = markdown_row(&pp);
        assert!(
            row.starts_with("| m,1 | 3.0 MiB | 134.52 M | CPU | tensor | cpu:0/cpu:1 | 2 | pp2048 ub512 | 300.00 ±"),
            "{row}"
        );
    }

    #[test]
    fn csv_and_json_carry_llama_bench_fields() {
        let pp = record(TestShape {
            n_prompt: 2048,
            n_ubatch: 512,
            ubatch_given: true,
            ..TestShape::default()
        });
        let header = csv_header(&pp);
        assert!(header.starts_with("build_commit,build_number,cpu_info,gpu_info,backends,model_filename,model_type,model_size,model_n_params,n_batch,n_ubatch,n_threads,"));
        assert!(
            header.ends_with(",n_prompt,n_gen,n_depth,test_time,avg_ns,stddev_ns,avg_ts,stddev_ts")
        );
        let row = csv_row(&pp);
        assert!(
            row.starts_with("\"abc1234\",\"7\",\"Some \"\"Fast\"\" CPU\",\"\",\"CPU\",\"models/m,1.gguf\",\"llama 135M Q4_1\",\"3145728\",\"134515008\",\"512\",\"512\",\"2\",\"f16\",\"f16\",\"tensor\",\"cpu:0/cpu:1\",\"0.00\",\"2048\",\"0\",\"0\",\"2026-12-01T23:40:00Z\",\"375000000\","),
            "{row}"
        );
        let json: serde_json::Value = serde_json::to_value(&pp).unwrap();
        let object = json.as_object().unwrap();
        // Every CSV column is a JSON field, and the JSON has the samples besides.
        for name in header.split(',') {
            assert!(object.contains_key(name), "{name}");
        }
        assert_eq!(object.len(), header.split(',').count() + 2);
        assert_eq!(json["n_prompt"], 2048);
        assert_eq!(json["samples_ts"][1], 400.0);
        assert_eq!(json["samples_ns"][0], 500_000_000);
        // Fields in llama-bench's order: the serialized text lists them so.
        let text = serde_json::to_string(&pp).unwrap();
        let at = |k: &str| text.find(&format!("\"{k}\":")).unwrap();
        assert!(at("build_commit") < at("model_filename"));
        assert!(at("n_depth") < at("test_time") && at("test_time") < at("avg_ns"));
        assert!(at("stddev_ts") < at("samples_ns"));
    }

    #[test]
    fn timestamps_are_utc_civil_dates() {
        let at = |s: u64| utc_timestamp(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn parameter_counts_read_like_llama_bench() {
        assert_eq!(params_label(134_515_008), "134.52 M");
        assert_eq!(params_label(8_030_261_248), "8.03 B");
    }
}
