//! `gemtune`: kernel development and autotuning harness for Gemma 4.
//!
//! Exit codes (shared by every subcommand): 0 pass, 1 performance regression,
//! 2 ambiguous, 3 correctness failure, 4 infrastructure error or bad input.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

mod choices;
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
    /// Measure tune's search strategies on a recorded tune result (no GPU):
    /// evaluations each needs to come within a few % of the best.
    SearchReplay(cmd::search_replay::Args),
    /// Prompt-processing and generation speed, llama-bench style (pp/tg t/s).
    Bench(cmd::bench::Args),
    /// Interleaved end-to-end A/B of two engine arms: numerics gate, then a verdict per phase.
    Ab(cmd::ab::Args),
    /// Join the report directories of sweep shards (check or tune --shard I/N) into one report.
    Merge(cmd::merge::Args),
    /// Compare two result files (tune, check, bench, ab, compile) and flag regressions.
    Report(cmd::report::Args),
}

/// The command line, with every option value allowed to start with '-'
/// when it reads as a number: `--min-effect -0.1` reaches the flag's own
/// range check instead of failing as an unknown argument `-0`.
fn command() -> clap::Command {
    Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|a| {
            if a.get_action().takes_values() {
                a.allow_negative_numbers(true)
            } else {
                a
            }
        })
    })
}

fn parse(args: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    let m = command().try_get_matches_from(args)?;
    Cli::from_arg_matches(&m)
}

fn main() -> ExitCode {
    // Usage errors exit 4 (bad input), not clap's 2, which scripts would
    // read as "ambiguous"; --help and --version exit 0.
    let cli = match parse(cli::normalize_args(std::env::args_os())) {
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
        Command::SearchReplay(a) => cmd::search_replay::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Ab(a) => cmd::ab::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Merge(a) => cmd::merge::run(a),
    };
    gemtune::interrupt::settle();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option that takes a value, given a negative number, either
    /// accepts it or refuses it with its own message: never as an unknown
    /// argument, never as clap's "invalid digit".
    #[test]
    fn every_option_reads_negative_numbers_as_values() {
        let cmd = command();
        let mut seen = 0;
        for sub in cmd.get_subcommands() {
            for a in sub.get_arguments() {
                let Some(long) = a.get_long() else { continue };
                if !a.get_action().takes_values() {
                    continue;
                }
                for v in ["-1", "-0.5"] {
                    seen += 1;
                    let args: Vec<std::ffi::OsString> =
                        ["gemtune", sub.get_name(), &format!("--{long}"), v]
                            .iter()
                            .map(std::ffi::OsString::from)
                            .collect();
                    let Err(e) = parse(args) else { continue };
                    let text = e.to_string();
                    assert_ne!(
                        e.kind(),
                        clap::error::ErrorKind::UnknownArgument,
                        "{} --{long} {v}: {text}",
                        sub.get_name()
                    );
                    assert!(
                        !text.contains("invalid digit"),
                        "{} --{long} {v}: {text}",
                        sub.get_name()
                    );
                }
            }
        }
        assert!(seen > 40, "only {seen} options were tried");
    }
}
