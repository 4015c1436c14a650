//! `gostw inspect`'s command line; the report is `crate::inspect`'s.

use std::path::PathBuf;

use crate::{binary::GoBinary, inspect};

/// Arguments of `gostw inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The Go executable to analyse.
    #[arg(required_unless_present = "pid", conflicts_with = "pid")]
    pub binary: Option<PathBuf>,
    /// Analyse the executable of this running process (containers too).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Print one JSON object (schema: docs/reference/json.md).
    #[arg(long)]
    pub json: bool,
}

/// Run `gostw inspect`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let report = match (args.pid, &args.binary) {
        (Some(pid), _) => inspect::inspect_pid(pid)?,
        (None, Some(path)) => inspect::inspect(&GoBinary::open(path)?, None)?,
        (None, None) => anyhow::bail!("give a binary or --pid"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", inspect::human(&report));
    }
    Ok(())
}
