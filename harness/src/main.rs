//! `gemtune`: kernel development and autotuning harness for Gemma 4.
//!
//! Exit codes (shared by every subcommand): 0 pass, 1 performance regression,
//! 2 ambiguous, 3 correctness failure, 4 infrastructure error or bad input.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod cli;
mod cmd;
mod engine_opts;
mod exit;

use exit::Exit;

#[derive(Parser)]
#[command(
    name = "gemtune",
    version,
    about = "Gemma 4 kernel development, autotuning and inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what gemtune does on this machine: a variant sweep and an engine
    /// figure on a GPU, the compile report and the CPU engine without one.
    Demo(cmd::demo::Args),
    /// Write a random-weight GGUF with the exact layout of a published Gemma 4 file.
    Synth(cmd::synth::Args),
    /// Describe a GGUF model: architecture, parameters, tensor types, per-layer table.
    Info(cmd::info::Args),
    /// Generate text with the chat template (or raw) and print prefill/decode speed.
    Run(cmd::run::Args),
    /// Print the token ids of a text.
    Tokenize(cmd::tokenize::Args),
    /// Print the text of comma- or space-separated token ids.
    Detokenize(cmd::tokenize::DetokenizeArgs),
    /// Write little-endian f32 logits for a token sequence.
    Logits(cmd::logits::Args),
    /// Check kernel variants against the CPU oracle.
    Check(cmd::check::Args),
    /// Check, then time kernel variants over shapes in the L2 and DRAM regimes.
    Tune(cmd::tune::Args),
    /// Prompt-processing and generation speed, llama-bench style (pp/tg t/s).
    Bench(cmd::bench::Args),
    /// Interleaved end-to-end A/B of two engine arms: numerics gate, then a verdict per phase.
    Ab(cmd::ab::Args),
    /// Compare two result files (tune, check, bench, ab, compile) and flag regressions.
    Report(cmd::report::Args),
}

fn main() -> ExitCode {
    // Usage errors exit 4 (bad input), not clap's 2, which scripts would
    // read as "ambiguous"; --help and --version exit 0.
    let cli = match Cli::try_parse_from(cli::normalize_args(std::env::args_os())) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let code = match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Exit::Pass,
                _ => Exit::Infra,
            };
            let _ = e.print();
            return code.into();
        }
    };
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Detokenize(a) => cmd::tokenize::run_detokenize(a),
        Command::Logits(a) => cmd::logits::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Tune(a) => cmd::tune::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Ab(a) => cmd::ab::run(a),
        Command::Report(a) => cmd::report::run(a),
    };
    // Compile recoveries (retries for a complete ptxas report, cubin
    // fallbacks, cache write failures) are counted, then told once here.
    if let Some(line) = gemtune_kernels::compile::take_recoveries().summary() {
        eprintln!("{line}");
    }
    match result {
        Ok(code) => code.into(),
        Err(e) => {
            eprintln!("error: {e:#}");
            Exit::Infra.into()
        }
    }
}
