//! `gostw check`'s command line; the report is `crate::check`'s.

use crate::check;

/// Arguments of `gostw check`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `gostw check`: its exit status is the report's.
pub fn run(args: &Args) -> anyhow::Result<i32> {
    let r = check::check();
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", check::human(&r));
    }
    Ok(r.exit_code)
}
