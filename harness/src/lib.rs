//! The `gemtune` harness as a library: spec parsing and sweep expansion,
//! statistics, result files, plots and tuned tables. The binary's
//! subcommands (`src/cmd`) are thin drivers over these modules, and the
//! integration tests under `tests/` call them directly.

pub mod ab;
pub mod attn_summary;
pub mod cells;
pub mod checker;
pub mod compare;
pub mod hash;
pub mod interrupt;
pub mod plots;
pub mod references;
pub mod report;
pub mod results;
pub mod results_cache;
pub mod roofline;
pub mod run_info;
pub mod scratch;
pub mod search;
pub mod spec;
pub mod stats;
pub mod tuned;
pub mod util;
pub mod verdict;
pub mod worker_pool;
