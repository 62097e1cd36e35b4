//! `backpack models …`: the model library from the command line.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use backpack_engine::hub::{
    self, DownloadControl, DownloadEvent, DownloadPlan, FitCheck, GpuBudget, HubClient, Library,
    RepoFile, RepoListing,
};
use clap::{Args, Subcommand};

use backpack_app::gui::store::default_data_dir;
use backpack_app::hub as hub_access;

#[derive(Args)]
pub struct ModelsArgs {
    /// The models folder (default: BACKPACK_MODELS_DIR, else `models` in the data dir).
    #[arg(long, global = true)]
    models_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Installed models.
    List,
    /// Search the hub by text.
    Search {
        text: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Download a repo's model files (verified; resumes an interrupted download).
    Download {
        /// owner/name on the hub (HF_ENDPOINT picks another hub; HF_TOKEN opens gated repos).
        repo: String,
        #[arg(long, default_value = "main")]
        revision: String,
        /// Only files matching these patterns (`*` within a name), e.g. --include "*.json".
        #[arg(long)]
        include: Vec<String>,
        /// The GGUF quantization to fetch, e.g. Q4_K_M.
        #[arg(long)]
        quant: Option<String>,
        /// Download even if the model looks too big for this GPU.
        #[arg(long)]
        no_fit_check: bool,
    },
    /// Delete an installed model.
    Rm { repo: String },
}

fn human(bytes: u64) -> String {
    backpack_app::gui::format_bytes(bytes)
}

pub fn run(args: ModelsArgs, adapter: Option<&str>) -> Result<()> {
    let library = Library::new(
        args.models_dir
            .unwrap_or_else(|| hub_access::default_models_dir(&default_data_dir())),
    );
    match args.command {
        ModelsCommand::List => {
            let installed = library.list();
            if installed.is_empty() {
                println!("no models installed in {}", library.root.display());
            }
            for m in installed {
                println!(
                    "{:<50} {:>10}  {}",
                    m.repo,
                    human(m.size),
                    m.model_path().display()
                );
            }
            let found = hub::SearchRoots::from_env().find();
            if !found.is_empty() {
                println!("\nfound on this machine (used in place, not copied):");
            }
            for m in found {
                println!(
                    "{:<50} {:>10}  {}  ({})",
                    m.name,
                    human(m.size),
                    m.path.display(),
                    m.source.label()
                );
            }
            Ok(())
        }
        ModelsCommand::Rm { repo } => {
            if library.remove(&repo)? {
                println!("removed {repo}");
                Ok(())
            } else {
                bail!("{repo} is not installed in {}", library.root.display())
            }
        }
        ModelsCommand::Search { text, limit } => {
            let client = hub_access::client(&default_data_dir())?;
            let found = runtime()?.block_on(client.search(&text, limit))?;
            if found.is_empty() {
                println!("no models match {text:?}");
            }
            for m in found {
                println!(
                    "{:<60} {:>10} downloads{}",
                    m.id,
                    m.downloads.unwrap_or(0),
                    if m.gated {
                        "  (gated: needs a token)"
                    } else {
                        ""
                    }
                );
            }
            Ok(())
        }
        ModelsCommand::Download {
            repo,
            revision,
            include,
            quant,
            no_fit_check,
        } => {
            let client = hub_access::client(&default_data_dir())?;
            let rt = runtime()?;
            let listing = rt.block_on(client.listing(&repo, &revision))?;
            let files = hub_access::select_files(&listing, &include, quant.as_deref())?;
            let dest = library.dir_for(&repo)?;
            let fit = rt.block_on(hub_access::fit_for(&client, &listing, &files));
            if !no_fit_check {
                check_fit(&fit, &listing, &files, adapter, &library)?;
            }
            let plan = DownloadPlan {
                repo: repo.clone(),
                revision,
                commit: listing.commit.clone(),
                files,
                dest,
            };
            println!(
                "downloading {} ({} files, {}) at {} into {}",
                repo,
                plan.files.len(),
                human(plan.total_bytes()),
                &listing.commit[..listing.commit.len().min(12)],
                plan.dest.display()
            );
            let dir = rt.block_on(download_with_progress(&client, &plan))?;
            println!(
                "done: every file verified; use it with --model {repo} (in {})",
                dir.display()
            );
            Ok(())
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Refuses a model that cannot fit, with the numbers, and names smaller GGUF variants that do.
fn check_fit(
    fit: &FitCheck,
    listing: &RepoListing,
    files: &[RepoFile],
    adapter: Option<&str>,
    library: &Library,
) -> Result<()> {
    let budget = match backpack_engine::gpu::Gpu::headless(adapter) {
        Ok(gpu) => Some(hub_access::gpu_budget(&gpu)),
        Err(e) => {
            eprintln!("warning: no GPU to check the model against ({e})");
            None
        }
    };
    let problem = match &budget {
        Some(b) => fit.check(b, &library.root).err(),
        None => None,
    }
    .or_else(|| {
        let dummy = GpuBudget {
            adapter: String::new(),
            max_binding: u64::MAX,
            max_buffer: u64::MAX,
            memory: None,
        };
        fit.check(&dummy, &library.root).err()
    });
    let Some(problem) = problem else {
        return Ok(());
    };
    let mut message = format!("{} does not fit: {problem}", listing.repo);
    if let Some(b) = &budget {
        let smaller = hub_access::smaller_variants(listing, files, fit, b);
        if !smaller.is_empty() {
            message += &format!(
                "\nsmaller variants that fit: {}",
                smaller
                    .iter()
                    .map(|(q, size)| format!("--quant {q} ({})", human(*size)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    message += "\n(--no-fit-check downloads it anyway)";
    bail!(message)
}

async fn download_with_progress(client: &HubClient, plan: &DownloadPlan) -> Result<PathBuf> {
    let tty = std::io::stdout().is_terminal();
    let mut last_line = Instant::now() - Duration::from_secs(10);
    let result = hub::download(
        client,
        plan,
        &DownloadControl::default(),
        |event| match event {
            DownloadEvent::Progress(p) => {
                let final_chunk = p.done == p.total;
                if tty || final_chunk || last_line.elapsed() >= Duration::from_secs(1) {
                    last_line = Instant::now();
                    let eta = p
                        .eta
                        .map_or_else(String::new, |e| format!(", {} s left", e.as_secs()));
                    let line = format!(
                        "{}: {} / {} ({:.0}%) at {}/s{eta}",
                        p.file,
                        human(p.done),
                        human(p.total),
                        100.0 * p.done as f64 / p.total.max(1) as f64,
                        human(p.bytes_per_s as u64),
                    );
                    if tty {
                        print!("\r\x1b[2K{line}");
                        let _ = std::io::stdout().flush();
                    } else {
                        println!("{line}");
                    }
                }
            }
            DownloadEvent::Retrying {
                file,
                attempt,
                delay,
                reason,
            } => {
                if tty {
                    println!();
                }
                println!(
                    "{file}: {reason}; resuming in {:.1} s (attempt {attempt})",
                    delay.as_secs_f64()
                );
            }
            DownloadEvent::Verified { file } => {
                if tty {
                    println!();
                }
                println!("{file}: verified");
            }
        },
    )
    .await;
    if tty {
        println!();
    }
    result.with_context(|| format!("downloading {}", plan.repo))
}
