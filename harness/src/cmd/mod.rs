//! One module per subcommand.

pub mod ab;
pub mod bench;
pub mod check;
pub mod demo;
pub mod info;
pub mod logits;
pub mod merge;
pub mod report;
pub mod run;
pub mod search_replay;
pub mod synth;
pub mod tokenize;
pub mod tune;
