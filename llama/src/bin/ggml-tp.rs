//! The `ggml-tp` program; everything is in [`llama::cli`].

fn main() -> std::process::ExitCode {
    llama::cli::main()
}
