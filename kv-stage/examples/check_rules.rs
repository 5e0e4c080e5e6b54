//! Loads rules files into a fresh stage and prints the resulting layout as
//! JSON, or prints the error (which names the file, line and field) and exits
//! with status 2.
//!
//! ```text
//! cargo run --release -p kv-stage --example check_rules -- rules.toml
//! cargo run --release -p kv-stage --example check_rules -- \
//!     --paio-channel-classifiers workflow \
//!     kv-stage/tests/paio/default_housekeeping_rules_file kv-stage/tests/paio/default_enforcement_rules_file
//! ```
//!
//! Several files are applied as one batch, in order: all of them or nothing.
//! The format comes from the extension (`.toml`, `.json`; Paio text for
//! none, `.paio`, `.txt`, `.rules`; another is refused) unless `--format`
//! says otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kv_stage::paio::{ChannelClassifiers, PaioOptions};
use kv_stage::{RuleSet, RulesFormat, Stage};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Check rules files and print the stage layout they produce")]
struct Args {
    /// Rules files, applied in order as one batch.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Format of every file: toml, json or paio (default: by extension).
    #[arg(long)]
    format: Option<RulesFormat>,
    /// Classifiers a Paio `create_channel` rule matches on: a comma-separated
    /// subset of workflow, type, context.
    #[arg(long, default_value = "context")]
    paio_channel_classifiers: ChannelClassifiers,
}

fn run(args: &Args) -> Result<serde_json::Value, String> {
    let paio = PaioOptions { channel_classifiers: args.paio_channel_classifiers };
    let mut set = RuleSet::default();
    for f in &args.files {
        let format = match args.format {
            Some(f) => f,
            None => RulesFormat::from_path(f).map_err(|e| e.to_string())?,
        };
        set.extend(RuleSet::load_as(f, format, &paio).map_err(|e| e.to_string())?);
    }
    let stage = Stage::new("check_rules");
    let report = stage.apply(&set).map_err(|e| e.to_string())?;
    let info = stage.stage_info();
    let warnings: Vec<String> = set.warnings.iter().chain(report.warnings.iter()).cloned().collect();
    Ok(json!({
        "rules": set.rules.len(),
        "warnings": warnings,
        "layout": {
            "default_channel": info.default_channel,
            "routes": info.routes,
            "channels": info.channels,
        },
    }))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).expect("layout serializes"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
