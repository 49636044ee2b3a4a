//! `gemtune check` (being built).

use crate::exit::Exit;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<Exit> {
    anyhow::bail!("`gemtune check` is not built yet")
}
