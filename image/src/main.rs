//! `nasos`: the host CLI. Turns a board recipe into a plan (and, later, into images and bundles).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use nasos_board::{Loaded, Report, load_recipe_file, schema};

#[derive(Parser)]
#[command(name = "nasos", version, about = "Build and boot nasos, the NFS-over-RDMA storage appliance firmware")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a recipe and its board; print every mistake with file:line:col and how to fix it.
    ///
    /// Exits 0 when the recipe is valid (warnings may still be printed), 1 when it is not.
    Validate {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// One line per finding (`file:line:col: error: …`), for editors and scripts.
        #[arg(long)]
        short: bool,
    },
    /// Print the plan: the fully resolved description of the image a recipe builds.
    Plan {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// Print the plan as JSON (what the image carries at /usr/lib/nasos/plan.json).
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of recipe or board files, for editors (e.g. taplo, VS Code Even Better TOML).
    Schema {
        /// Which schema.
        #[arg(value_enum, default_value_t = SchemaKind::Recipe)]
        kind: SchemaKind,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum SchemaKind {
    Recipe,
    Board,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nasos: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate { recipe, short } => {
            let loaded = load(&recipe, short)?;
            Ok(match loaded {
                Some(_) => {
                    println!("{}: valid", recipe.display());
                    ExitCode::SUCCESS
                }
                None => ExitCode::from(1),
            })
        }
        Command::Plan { recipe, json } => {
            let Some(loaded) = load(&recipe, false)? else { return Ok(ExitCode::from(1)) };
            let plan = loaded.plan();
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &plan).context("writing the plan")?;
                writeln!(out)?;
            } else {
                write!(out, "{plan}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema { kind } => {
            let schema = match kind {
                SchemaKind::Recipe => schema::recipe_schema(),
                SchemaKind::Board => schema::board_schema(),
            };
            println!("{}", serde_json::to_string_pretty(&schema)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Loads a recipe, printing its diagnostics to stderr. `None` means it had errors.
fn load(recipe: &std::path::Path, short: bool) -> anyhow::Result<Option<Loaded>> {
    let (loaded, report) = match load_recipe_file(recipe) {
        Ok(loaded) => {
            let report = loaded.report.clone();
            (Some(loaded), report)
        }
        Err(report) => (None, report),
    };
    print_report(&report, short)?;
    Ok(loaded)
}

fn print_report(report: &Report, short: bool) -> anyhow::Result<()> {
    if report.diagnostics.is_empty() {
        return Ok(());
    }
    let mut err = std::io::stderr().lock();
    if short {
        for d in &report.diagnostics {
            writeln!(err, "{d}")?;
        }
    } else {
        write!(err, "{}", report.render())?;
    }
    Ok(())
}
