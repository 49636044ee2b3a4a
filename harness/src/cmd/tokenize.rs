//! `gemtune tokenize` / `gemtune detokenize` (being built).

use crate::exit::Exit;

#[derive(clap::Args)]
pub struct Args {}

#[derive(clap::Args)]
pub struct DetokenizeArgs {}

pub fn run(_args: Args) -> anyhow::Result<Exit> {
    anyhow::bail!("`gemtune tokenize` is not built yet")
}

pub fn run_detokenize(_args: DetokenizeArgs) -> anyhow::Result<Exit> {
    anyhow::bail!("`gemtune detokenize` is not built yet")
}
