//! `gemtune search-replay RESULTS.csv...`: measures the search strategies
//! without a GPU, with a tune result file as the objective
//! (`gemtune::search::replay`): per (family, shape, regime) of the file and
//! per strategy, the evaluations needed to reach a cell within
//! `--within` % of the file's best, over seeds 0..`--seeds`. Prints
//! markdown tables; `--csv` keeps every run.

use crate::exit::Exit;
use gemtune::results::{read_csv, TuneRow};
use gemtune::search::replay;
use gemtune::search::StrategyKind;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Tune results.csv file(s) to replay.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Strategies to replay (default: all); repeatable.
    #[arg(long = "strategy", value_enum)]
    pub strategies: Vec<StrategyKind>,
    /// Seeds 0..N per seeded strategy.
    #[arg(long, default_value_t = 20, value_parser = crate::cli::positive_usize)]
    pub seeds: usize,
    /// Target: within this many percent of the best recorded median.
    #[arg(long, default_value_t = 3.0, value_parser = crate::cli::positive_f64)]
    pub within: f64,
    /// Only rows of this regime (l2 or dram).
    #[arg(long)]
    pub regime: Option<String>,
    /// Spaces with fewer points are left out (too small to search).
    #[arg(long, default_value_t = 8, value_parser = crate::cli::positive_usize)]
    pub min_points: usize,
    /// Write every replayed run (file, family, shape, regime, points,
    /// strategy, seed, evaluations) to this CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct RunRow {
    file: String,
    family: String,
    shape: String,
    regime: String,
    points: usize,
    strategy: String,
    seed: u64,
    evaluations: usize,
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    let strategies: Vec<StrategyKind> = if a.strategies.is_empty() {
        StrategyKind::ALL.to_vec()
    } else {
        a.strategies.clone()
    };
    let tolerance = a.within / 100.0;
    let mut all_rows = Vec::new();
    for path in &a.results {
        let rows: Vec<TuneRow> = match read_csv(path) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {}: {e:#}", path.display());
                return Ok(Exit::Infra);
            }
        };
        let rows: Vec<TuneRow> = rows
            .into_iter()
            .filter(|r| a.regime.as_ref().is_none_or(|g| &r.regime == g))
            .collect();
        let groups = replay::groups(&rows, a.min_points);
        if groups.is_empty() {
            eprintln!(
                "error: {}: no (family, shape, regime) with {} or more timed variants",
                path.display(),
                a.min_points
            );
            return Ok(Exit::Infra);
        }
        let runs = replay::replay_all(&groups, &strategies, a.seeds as u64, tolerance)?;
        println!("## Replay of {}\n", path.display());
        println!("{}", replay::table(&groups, &runs, &strategies, tolerance));
        all_rows.extend(runs.iter().map(|r| {
            let g = &groups[r.group];
            RunRow {
                file: path.display().to_string(),
                family: g.family.clone(),
                shape: g.shape.clone(),
                regime: g.regime.clone(),
                points: g.space.len(),
                strategy: r.strategy.to_string(),
                seed: r.seed,
                evaluations: r.evals,
            }
        }));
    }
    if let Some(p) = &a.csv {
        gemtune::results::write_csv(p, &all_rows)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(Exit::Pass)
}
