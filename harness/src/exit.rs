//! Process exit codes shared by every subcommand (the README's "Exit codes"
//! table, which `tests/cli_contract.rs` holds the binary to).

use std::process::ExitCode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Pass = 0,
    Regression = 1,
    Ambiguous = 2,
    Correctness = 3,
    /// No GPU, compile failure of a required variant, bad input file.
    Infra = 4,
    /// Stopped by SIGINT or SIGTERM (`gemtune::interrupt`).
    Interrupted = gemtune::interrupt::INTERRUPTED as isize,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}
