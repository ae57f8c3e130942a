//! `muxflow-matcher`: pairs pending offline jobs with GPUs running online
//! jobs. Built by the matcher issue; this entry point only checks the config.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// muxflow config file.
    #[arg(long, default_value = muxflow::config::DEFAULT_PATH)]
    config: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    muxflow::Config::load(&cli.config).with_context(|| "loading the muxflow config")?;
    anyhow::bail!("muxflow-matcher: matching is not built yet (see the matcher issue)")
}
