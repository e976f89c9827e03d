//! The options every model-loading command shares (`-m` or `--synthetic`, `--split-mode`,
//! `--devices`, `--cpu-devices`, `--tensor-split`, `-t`, `-c`, `--cache-type`), the [`Placement`]
//! they describe and the loading of a model (a GGUF file, or a random-weight model built in memory,
//! [`llama::model::synthetic`]) with a progress bar on stderr.
//!
//! `bench` accepts several models, split modes and CPU device counts and runs every combination
//! ([`ModelArgs::setups`]); the other commands take one of each ([`ModelArgs::setup`]).

use super::{CliError, CliResult};
use backend_cpu::device::{system_memory, CpuDevice};
use backend_meta::MetaDevice;
use clap::builder::RangedU64ValueParser;
use ggml_core::backend::Device;
use ggml_core::gguf::GgufFile;
use ggml_core::DType;
use indicatif::{ProgressBar, ProgressStyle};
use llama::load::limits::{self, Bound};
use llama::model::synthetic::Preset;
use llama::model::{Model, ModelError, Placement};
use llama::runtime::SessionOptions;
use llama::tokenizer::Tokenizer;
use llama::Arch;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the model is spread over the devices.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    /// Everything on one device.
    None,
    /// Contiguous ranges of layers per device.
    Layer,
    /// Every weight sharded over all devices (tensor parallelism).
    Tensor,
}

impl SplitMode {
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
            SplitMode::Tensor => "tensor",
        }
    }
}

/// Element type of the KV cache.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheType {
    F16,
    F32,
    #[value(name = "q8_0")]
    Q8_0,
}

impl CacheType {
    pub fn dtype(self) -> DType {
        match self {
            CacheType::F16 => DType::F16,
            CacheType::F32 => DType::F32,
            CacheType::Q8_0 => DType::Q8_0,
        }
    }
}

/// Model and placement options.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: Vec<PathBuf>,
    /// A random-weight model with published shapes instead of a file, e.g. llama3-8b-q4_0
    /// (SHAPE-TYPE; SHAPE: llama3-8b, qwen3-30b-a3b, gpt-oss-20b, qwen3-next-80b-a3b, qwen3.5-27b,
    /// qwen3.5-35b-a3b, and tiny-*/small-* test ones; TYPE: f16, bf16, q8_0, q4_0, q4_k, q6_k,
    /// mxfp4; an unknown one lists all).
    #[arg(long, value_name = "PRESET")]
    pub synthetic: Vec<String>,
    /// none: one device; layer: layers spread over the devices; tensor: weights sharded over them
    /// (default: none for one device, layer for several).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub split_mode: Vec<SplitMode>,
    /// Devices by name, comma-separated (e.g. cpu:0,cpu:1; see `ggml-tp devices`).
    #[arg(long, value_delimiter = ',', conflicts_with = "cpu_devices")]
    pub devices: Vec<String>,
    /// Use N virtual CPU devices sharing the threads.
    #[arg(long, value_delimiter = ',', value_parser = bounded(limits::CPU_DEVICES))]
    pub cpu_devices: Vec<usize>,
    /// Share of each device, comma-separated (e.g. 3,1); default equal.
    #[arg(long, value_delimiter = ',')]
    pub tensor_split: Vec<f32>,
    /// CPU threads in all (default: all cores).
    #[arg(short = 't', long, value_parser = bounded(limits::THREADS))]
    pub threads: Option<usize>,
    /// Context size in tokens (default depends on the command).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// KV cache element type.
    #[arg(long, value_enum, default_value = "f16")]
    pub cache_type: CacheType,
    /// No progress bar while loading.
    #[arg(long)]
    pub no_progress: bool,
}

/// The parser of a count in `bound`.
fn bounded(bound: Bound) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(bound.min as u64..=bound.max as u64)
}

/// Where a model comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSource {
    File(PathBuf),
    /// A synthetic preset's name.
    Synthetic(String),
}

impl ModelSource {
    /// The file name without `.gguf`, or the preset's name.
    pub fn name(&self) -> String {
        match self {
            ModelSource::File(path) => path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
            ModelSource::Synthetic(p) => format!("synthetic {p}"),
        }
    }
}

/// One model with one placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    pub model: ModelSource,
    /// The split mode asked for (`None` = default by device count).
    pub split_mode: Option<SplitMode>,
    /// Virtual CPU devices asked for.
    pub cpu_devices: Option<usize>,
    /// Run on the first of the devices only (`bench` rows of split mode none).
    pub first_device_only: bool,
}

impl ModelArgs {
    /// Every combination of models, split modes and CPU device counts (for `bench`).
    pub fn setups(&self) -> Vec<Setup> {
        let splits: Vec<Option<SplitMode>> = if self.split_mode.is_empty() {
            vec![None]
        } else {
            self.split_mode.iter().copied().map(Some).collect()
        };
        let cpus: Vec<Option<usize>> = if self.cpu_devices.is_empty() {
            vec![None]
        } else {
            self.cpu_devices.iter().copied().map(Some).collect()
        };
        let sources = self
            .model
            .iter()
            .cloned()
            .map(ModelSource::File)
            .chain(self.synthetic.iter().cloned().map(ModelSource::Synthetic));
        let mut out = Vec::new();
        for model in sources {
            for &split_mode in &splits {
                for &cpu_devices in &cpus {
                    out.push(Setup {
                        model: model.clone(),
                        split_mode,
                        cpu_devices,
                        first_device_only: false,
                    });
                }
            }
        }
        out
    }

    /// The one setup of a command that takes a single model and placement.
    pub fn setup(&self) -> CliResult<Setup> {
        let one = |n: usize, what: &str| {
            if n > 1 {
                Err(CliError::new(format!(
                    "{what} takes one value here (several only for `bench`)"
                )))
            } else {
                Ok(())
            }
        };
        if self.model.is_empty() && self.synthetic.is_empty() {
            return Err(CliError::new(
                "no model: give -m FILE (or --synthetic PRESET)",
            ));
        }
        one(self.model.len() + self.synthetic.len(), "--model")?;
        one(self.split_mode.len(), "--split-mode")?;
        one(self.cpu_devices.len(), "--cpu-devices")?;
        Ok(self.setups().remove(0))
    }

    /// Threads in all.
    pub fn threads(&self) -> usize {
        self.threads
            .filter(|&t| t > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |v| v.get()))
    }

    /// Session options with `default_ctx` unless `-c` was given.
    pub fn session_options(&self, default_ctx: usize) -> SessionOptions {
        SessionOptions {
            n_ctx: self.ctx_size.unwrap_or(default_ctx).max(1),
            kv_type: self.cache_type.dtype(),
        }
    }

    /// The devices of `setup`: named ones, or `--cpu-devices` virtual CPU devices (default one).
    pub fn devices(&self, setup: &Setup) -> CliResult<Vec<Arc<dyn Device>>> {
        let threads = self.threads();
        if self.devices.is_empty() {
            let n = if setup.first_device_only {
                1
            } else {
                setup.cpu_devices.unwrap_or(1)
            };
            return (0..n).map(|i| cpu_device(i, i, n, threads)).collect();
        }
        let names = if setup.first_device_only {
            &self.devices[..1]
        } else {
            &self.devices[..]
        };
        let n_cpu = names.iter().filter(|d| d.starts_with("cpu:")).count();
        let mut out: Vec<Arc<dyn Device>> = Vec::new();
        let mut k = 0;
        for name in names {
            if out.iter().any(|d| d.name() == *name) {
                return Err(CliError::new(format!("device {name} is given twice")));
            }
            let dev = match name.strip_prefix("cpu:") {
                Some(i) => {
                    let i = i.parse().map_err(|_| {
                        CliError::new(format!("bad device name {name:?} (cpu:0, cpu:1, ...)"))
                    })?;
                    k += 1;
                    cpu_device(i, k - 1, n_cpu, threads)?
                }
                None => ggml_core::registry::device(name).map_err(|e| {
                    CliError::from(e).context(format_args!("device {name} (see `ggml-tp devices`)"))
                })?,
            };
            out.push(dev);
        }
        Ok(out)
    }

    /// The placement of `setup` and its devices' names.
    pub fn placement(&self, setup: &Setup) -> CliResult<(Placement, SplitMode, Vec<String>)> {
        let devices = self.devices(setup)?;
        let names: Vec<String> = devices.iter().map(|d| d.name()).collect();
        let n = devices.len();
        let mode = setup.split_mode.unwrap_or(if n > 1 {
            SplitMode::Layer
        } else {
            SplitMode::None
        });
        let ratios = if self.tensor_split.is_empty() {
            vec![1.0; n]
        } else if self.tensor_split.len() != n {
            return Err(CliError::new(format!(
                "--tensor-split has {} values for {n} device{}",
                self.tensor_split.len(),
                if n == 1 { "" } else { "s" }
            )));
        } else if self.tensor_split.iter().any(|r| !r.is_finite() || *r < 0.0)
            || self.tensor_split.iter().sum::<f32>() <= 0.0
        {
            return Err(CliError::new(
                "--tensor-split values must be >= 0 with a positive sum",
            ));
        } else {
            self.tensor_split.clone()
        };
        let placement = match mode {
            SplitMode::None if n > 1 => {
                return Err(CliError::new(format!(
                    "--split-mode none runs on one device, {n} given (use layer or tensor)"
                )))
            }
            SplitMode::None => Placement::Single(devices[0].clone()),
            SplitMode::Layer => Placement::Layers { devices, ratios },
            SplitMode::Tensor => Placement::Tensor(MetaDevice::new(devices, Some(ratios))?),
        };
        Ok((placement, mode, names))
    }
}

/// CPU device `index`, the `pos`-th of `n` sharing `threads` (the memory budget split evenly too).
fn cpu_device(index: usize, pos: usize, n: usize, threads: usize) -> CliResult<Arc<dyn Device>> {
    let n = n.max(1);
    let share = (threads / n + usize::from(pos < threads % n)).max(1);
    Ok(CpuDevice::new(index, share, system_memory() / n)? as Arc<dyn Device>)
}

/// A loaded model with its tokenizer and GGUF file (for metadata such as the chat template).
pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub file: GgufFile,
    pub source: ModelSource,
    pub split_mode: SplitMode,
    pub device_names: Vec<String>,
    pub file_size: u64,
}

impl Loaded {
    /// The file name without `.gguf`, or the synthetic preset.
    pub fn name(&self) -> String {
        self.source.name()
    }
}

/// Seed of the weights of `--synthetic` models (fixed, so every run measures the same model).
pub const SYNTHETIC_SEED: u64 = 0x5EED;

/// Opens a GGUF file reading it through with a progress bar, or builds a synthetic one.
fn open(args: &ModelArgs, source: &ModelSource) -> CliResult<GgufFile> {
    match source {
        ModelSource::File(path) => {
            let ctx = |e: CliError| e.context(path.display());
            let meta = std::fs::metadata(path)
                .map_err(|_| CliError::new(format!("model file not found: {}", path.display())))?;
            if !meta.is_file() {
                return Err(CliError::new(format!("not a file: {}", path.display())));
            }
            let bar = progress_bar(args.no_progress, meta.len());
            read_through(path, &bar).map_err(|e| ctx(e.into()))?;
            bar.finish_and_clear();
            GgufFile::open(path).map_err(|e| ctx(e.into()))
        }
        ModelSource::Synthetic(name) => {
            let preset = Preset::parse(name)?;
            let bar = progress_bar(args.no_progress, 0);
            bar.set_style(spinner_style());
            bar.set_message(format!("generating the weights of {}", preset.name()));
            bar.enable_steady_tick(Duration::from_millis(120));
            let file = preset.build(SYNTHETIC_SEED);
            bar.finish_and_clear();
            Ok(file?)
        }
    }
}

/// Loads `setup` with a progress bar: reading the file (or generating it), then placing the weights.
pub fn load(args: &ModelArgs, setup: &Setup) -> CliResult<Loaded> {
    let ctx = |e: CliError| e.context(setup.model.name());
    let (placement, split_mode, device_names) = args.placement(setup)?;
    let start = Instant::now();
    let file = open(args, &setup.model)?;
    let file_size = file.as_bytes().len() as u64;
    let bar = progress_bar(args.no_progress, 0);
    bar.set_style(spinner_style());
    bar.set_message(format!(
        "placing weights ({}, {})",
        split_mode.name(),
        device_names.join(",")
    ));
    bar.enable_steady_tick(Duration::from_millis(120));
    let result = (|| -> CliResult<Loaded> {
        let arch = file.get_str("general.architecture")?;
        if Arch::from_name(arch).is_none() {
            return Err(ModelError::UnknownArch(arch.into()).into());
        }
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let model = Model::from_gguf(&file, &placement)?;
        Ok(Loaded {
            model: Arc::new(model),
            tokenizer,
            file,
            source: setup.model.clone(),
            split_mode,
            device_names,
            file_size,
        })
    })();
    bar.finish_and_clear();
    let loaded = result.map_err(ctx)?;
    let c = &loaded.model.config;
    eprintln!(
        "loaded {} ({}, {} layers, {:.0} MiB) with split mode {} on {} in {:.2} s",
        loaded.name(),
        c.arch.name(),
        c.n_layer,
        loaded.file_size as f64 / (1 << 20) as f64,
        split_mode.name(),
        loaded.device_names.join(","),
        start.elapsed().as_secs_f64()
    );
    Ok(loaded)
}

fn progress_bar(hidden: bool, len: u64) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message("reading");
    bar
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg} {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// Reads the file once (filling the page cache the memory map then uses), advancing `bar`.
fn read_through(path: &Path, bar: &ProgressBar) -> std::io::Result<()> {
    if bar.is_hidden() {
        return Ok(());
    }
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        bar.inc(n as u64);
    }
}
