//! The `ggml-tp` program; everything is in [`ggml_tp::cli`].

fn main() -> std::process::ExitCode {
    ggml_tp::cli::main()
}
