//! `rdmalane-perf`: perftest/fabtests-style benchmarks for rdmalane.
//!
//! On one host it runs both sides (the server in a child process); `--server --listen ADDR` and
//! `--connect ADDR` split them over two hosts. `--engine raw` drives the transport directly, the
//! baseline the runtime's overhead is measured against. `--json` ends with one JSON object.
mod bw;
mod cli;
mod conn;
mod gpu;
mod lat;
mod mixed;
mod pages;
mod report;
mod svg;
mod tenants;

use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = cli::Cli::parse();
    let result = match &cli.cmd {
        cli::Cmd::Lat(a) => lat::run(a),
        cli::Cmd::Bw(a) => bw::run(a),
        cli::Cmd::Mixed(a) => mixed::run(a),
        cli::Cmd::Tenants(a) => tenants::run(a),
        cli::Cmd::Pages(p) => pages::run(p),
    };
    if let Err(e) = result {
        eprintln!("rdmalane-perf: {e}");
        std::process::exit(1);
    }
}
