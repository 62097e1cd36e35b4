//! The Models panel's hub side: searching, listing a repo, and the download queue. Hub work
//! runs on its own tokio runtime; results come back over a channel drained every frame.

use std::path::PathBuf;
use std::sync::mpsc;

use backpack_engine::hub::{
    self, DownloadControl, DownloadEvent, DownloadPlan, DownloadProgress, FitCheck, FoundModel,
    GpuBudget, HubClient, HubError, InstalledModel, Library, ModelSummary, RepoFile, RepoListing,
    SearchRoots,
};
use eframe::egui;

/// Which files of a repo a download takes.
#[derive(Clone, Debug)]
pub enum Selection {
    /// Files matching these patterns (catalog variants).
    Patterns(Vec<String>),
    /// One GGUF quantization.
    Quant(String),
    /// The safetensors model (or the only GGUF variant).
    Default,
}

#[derive(Clone, Debug, PartialEq)]
pub enum JobState {
    Preparing,
    Running,
    Paused,
    Done(PathBuf),
    Failed(String),
    Cancelled,
}

pub struct Job {
    pub id: u64,
    pub repo: String,
    pub label: String,
    pub state: JobState,
    pub progress: Option<DownloadProgress>,
    /// The last retry, shown under the bar.
    pub note: Option<String>,
    control: DownloadControl,
    plan: Option<DownloadPlan>,
}

impl Job {
    pub fn total(&self) -> Option<u64> {
        self.plan.as_ref().map(DownloadPlan::total_bytes)
    }
}

enum Update {
    Planned(u64, DownloadPlan),
    Event(u64, DownloadEvent),
    Finished(u64, Result<PathBuf, HubError>),
    Failed(u64, String),
    Searched(Result<Vec<ModelSummary>, String>),
    Listed(Result<(RepoListing, FitCheck), String>),
}

pub struct Downloads {
    runtime: tokio::runtime::Runtime,
    tx: mpsc::Sender<Update>,
    rx: mpsc::Receiver<Update>,
    client: Result<HubClient, String>,
    /// The models folder downloads go into.
    pub models: Library,
    pub jobs: Vec<Job>,
    next_id: u64,
    pub search_text: String,
    pub searching: bool,
    pub results: Result<Vec<ModelSummary>, String>,
    pub listing_pending: Option<String>,
    pub listing: Option<Result<(RepoListing, FitCheck), String>>,
    /// Bumped whenever the installed set changes; `installed()` re-reads the folder then.
    pub installed_generation: u64,
    /// The installed models as of `installed_generation` (reading the folder every frame would
    /// walk every model's files).
    installed_cache: Option<(u64, Vec<InstalledModel>)>,
    /// Models other tools put on this machine, as of `installed_generation`.
    found_cache: Option<(u64, Vec<FoundModel>)>,
    other_tools: SearchRoots,
    ctx: egui::Context,
}

impl Downloads {
    pub fn new(
        ctx: &egui::Context,
        client: Result<HubClient, String>,
        models: Library,
        other_tools: SearchRoots,
    ) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("backpack-hub")
            .enable_all()
            .build()?;
        let (tx, rx) = mpsc::channel();
        Ok(Self {
            runtime,
            tx,
            rx,
            client,
            models,
            jobs: Vec::new(),
            next_id: 1,
            search_text: String::new(),
            searching: false,
            results: Ok(Vec::new()),
            listing_pending: None,
            listing: None,
            installed_generation: 0,
            installed_cache: None,
            found_cache: None,
            other_tools,
            ctx: ctx.clone(),
        })
    }

    /// Installed models, re-read only after a download, a removal or a folder change.
    pub fn installed(&mut self) -> &[InstalledModel] {
        let generation = self.installed_generation;
        if self
            .installed_cache
            .as_ref()
            .is_none_or(|(g, _)| *g != generation)
        {
            self.installed_cache = Some((generation, self.models.list()));
        }
        self.installed_cache
            .as_ref()
            .map_or(&[], |(_, list)| list.as_slice())
    }

    /// Models in the Hugging Face cache and LM Studio's and Ollama's folders, re-read with the
    /// installed ones.
    pub fn found(&mut self) -> &[FoundModel] {
        let generation = self.installed_generation;
        if self
            .found_cache
            .as_ref()
            .is_none_or(|(g, _)| *g != generation)
        {
            self.found_cache = Some((generation, self.other_tools.find()));
        }
        self.found_cache
            .as_ref()
            .map_or(&[], |(_, list)| list.as_slice())
    }

    /// Deletes an installed model.
    pub fn remove(&mut self, repo: &str) -> Result<bool, HubError> {
        self.installed_generation += 1;
        self.models.remove(repo)
    }

    /// Downloads go to `models` from now on.
    pub fn set_models(&mut self, models: Library) {
        self.models = models;
        self.installed_generation += 1;
    }

    pub fn set_client(&mut self, client: Result<HubClient, String>) {
        self.client = client;
    }

    fn send(tx: &mpsc::Sender<Update>, ctx: &egui::Context, update: Update) {
        let _ = tx.send(update);
        ctx.request_repaint();
    }

    pub fn search(&mut self) {
        let Ok(client) = self.client.clone() else {
            self.results = Err(self.client.clone().err().unwrap_or_default());
            return;
        };
        let text = self.search_text.trim().to_owned();
        self.searching = true;
        let (tx, ctx) = (self.tx.clone(), self.ctx.clone());
        self.runtime.spawn(async move {
            let result = client.search(&text, 30).await.map_err(|e| e.to_string());
            Self::send(&tx, &ctx, Update::Searched(result));
        });
    }

    /// Lists `repo` with the sizes of what a default download would take.
    pub fn open_repo(&mut self, repo: &str) {
        let Ok(client) = self.client.clone() else {
            return;
        };
        self.listing_pending = Some(repo.to_owned());
        self.listing = None;
        let (tx, ctx, repo) = (self.tx.clone(), self.ctx.clone(), repo.to_owned());
        self.runtime.spawn(async move {
            let result = async {
                let listing = client.listing(&repo, "main").await?;
                let files = crate::hub::select_files(&listing, &[], None).unwrap_or_default();
                let fit = crate::hub::fit_for(&client, &listing, &files).await;
                Ok::<_, HubError>((listing, fit))
            }
            .await
            .map_err(|e| e.to_string());
            Self::send(&tx, &ctx, Update::Listed(result));
        });
    }

    /// Queues a download of `repo`; it is refused (with the numbers) if it cannot fit `gpu`.
    pub fn start(
        &mut self,
        repo: &str,
        revision: &str,
        label: &str,
        selection: Selection,
        gpu: Option<GpuBudget>,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        let control = DownloadControl::default();
        self.jobs.push(Job {
            id,
            repo: repo.to_owned(),
            label: label.to_owned(),
            state: JobState::Preparing,
            progress: None,
            note: None,
            control: control.clone(),
            plan: None,
        });
        let client = match self.client.clone() {
            Ok(c) => c,
            Err(e) => {
                self.fail(id, e);
                return;
            }
        };
        let dest = match self.models.dir_for(repo) {
            Ok(d) => d,
            Err(e) => {
                self.fail(id, e.to_string());
                return;
            }
        };
        let root = self.models.root.clone();
        let (tx, ctx) = (self.tx.clone(), self.ctx.clone());
        let (repo, revision) = (repo.to_owned(), revision.to_owned());
        self.runtime.spawn(async move {
            match plan(&client, repo, revision, &selection, gpu, root, dest).await {
                Ok(plan) => {
                    Self::send(&tx, &ctx, Update::Planned(id, plan.clone()));
                    Self::run(client, plan, control, id, tx, ctx).await;
                }
                Err(e) => Self::send(&tx, &ctx, Update::Failed(id, e)),
            }
        });
    }

    async fn run(
        client: HubClient,
        plan: DownloadPlan,
        control: DownloadControl,
        id: u64,
        tx: mpsc::Sender<Update>,
        ctx: egui::Context,
    ) {
        let events = tx.clone();
        let wake = ctx.clone();
        let result = hub::download(&client, &plan, &control, move |e| {
            // Progress comes at most every 100 ms; each one is worth a frame.
            Self::send(&events, &wake, Update::Event(id, e));
        })
        .await;
        Self::send(&tx, &ctx, Update::Finished(id, result));
    }

    fn fail(&mut self, id: u64, message: String) {
        if let Some(job) = self.jobs.iter_mut().find(|j| j.id == id) {
            job.state = JobState::Failed(message);
        }
    }

    pub fn pause(&mut self, id: u64) {
        if let Some(job) = self.jobs.iter().find(|j| j.id == id) {
            job.control.pause();
        }
    }

    pub fn resume(&mut self, id: u64) {
        let Ok(client) = self.client.clone() else {
            return;
        };
        let Some(job) = self.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        let Some(plan) = job.plan.clone() else {
            return;
        };
        job.control.resume();
        job.state = JobState::Running;
        job.note = None;
        let (tx, ctx, control) = (self.tx.clone(), self.ctx.clone(), job.control.clone());
        self.runtime
            .spawn(async move { Self::run(client, plan, control, id, tx, ctx).await });
    }

    pub fn cancel(&mut self, id: u64) {
        let Some(job) = self.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        match job.state {
            JobState::Running | JobState::Preparing => job.control.cancel(),
            JobState::Paused | JobState::Failed(_) => {
                // Nothing runs: drop the partial files here.
                if let Some(plan) = &job.plan {
                    let _ = std::fs::remove_dir_all(hub::partial_dir(&plan.dest));
                }
                job.state = JobState::Cancelled;
            }
            _ => {}
        }
    }

    /// Removes finished, failed and cancelled jobs from the queue.
    pub fn clear_finished(&mut self) {
        self.jobs.retain(|j| {
            matches!(
                j.state,
                JobState::Preparing | JobState::Running | JobState::Paused
            )
        });
    }

    pub fn active(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| matches!(j.state, JobState::Preparing | JobState::Running))
            .count()
    }

    /// Applies what the hub tasks reported.
    pub fn poll(&mut self) {
        while let Ok(update) = self.rx.try_recv() {
            match update {
                Update::Searched(r) => {
                    self.searching = false;
                    self.results = r;
                }
                Update::Listed(r) => {
                    self.listing_pending = None;
                    self.listing = Some(r);
                }
                Update::Planned(id, plan) => {
                    if let Some(job) = self.jobs.iter_mut().find(|j| j.id == id) {
                        job.plan = Some(plan);
                        job.state = JobState::Running;
                    }
                }
                Update::Event(id, event) => {
                    if let Some(job) = self.jobs.iter_mut().find(|j| j.id == id) {
                        match event {
                            DownloadEvent::Progress(p) => job.progress = Some(p),
                            DownloadEvent::Retrying {
                                file,
                                attempt,
                                reason,
                                ..
                            } => {
                                job.note =
                                    Some(format!("{file}: {reason}; resuming (attempt {attempt})"));
                            }
                            DownloadEvent::Verified { file } => {
                                job.note = Some(format!("{file} verified"));
                            }
                        }
                    }
                }
                Update::Failed(id, message) => self.fail(id, message),
                Update::Finished(id, result) => {
                    if let Some(job) = self.jobs.iter_mut().find(|j| j.id == id) {
                        job.state = match result {
                            Ok(dir) => JobState::Done(dir),
                            Err(HubError::Paused) => JobState::Paused,
                            Err(HubError::Cancelled) => JobState::Cancelled,
                            Err(e) => JobState::Failed(e.to_string()),
                        };
                        if matches!(job.state, JobState::Done(_)) {
                            self.installed_generation += 1;
                        }
                    }
                }
            }
        }
    }
}

/// What to fetch of `repo`: the selected files, refused (with smaller variants that would fit)
/// when they cannot fit `gpu` or the disk under `root`.
async fn plan(
    client: &HubClient,
    repo: String,
    revision: String,
    selection: &Selection,
    gpu: Option<GpuBudget>,
    root: PathBuf,
    dest: PathBuf,
) -> Result<DownloadPlan, String> {
    let listing = client
        .listing(&repo, &revision)
        .await
        .map_err(|e| e.to_string())?;
    let files: Vec<RepoFile> = match selection {
        Selection::Patterns(p) => listing
            .files
            .iter()
            .filter(|f| p.iter().any(|p| hub::glob_match(p, &f.path)))
            .cloned()
            .collect(),
        Selection::Quant(q) => {
            crate::hub::select_files(&listing, &[], Some(q)).map_err(|e| e.to_string())?
        }
        Selection::Default => {
            crate::hub::select_files(&listing, &[], None).map_err(|e| e.to_string())?
        }
    };
    if files.is_empty() {
        return Err(format!("{repo} has no files for {selection:?}"));
    }
    let fit = crate::hub::fit_for(client, &listing, &files).await;
    let unlimited = GpuBudget {
        adapter: String::new(),
        max_binding: u64::MAX,
        max_buffer: u64::MAX,
        memory: None,
    };
    if let Err(problem) = fit.check(gpu.as_ref().unwrap_or(&unlimited), &root) {
        let mut message = format!("Not downloaded: {problem}.");
        if let Some(gpu) = &gpu {
            let smaller = crate::hub::smaller_variants(&listing, &files, &fit, gpu);
            if !smaller.is_empty() {
                message += &format!(
                    " These would fit: {}.",
                    smaller
                        .iter()
                        .map(|(q, s)| format!("{q} ({})", super::common::format_bytes(*s)))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        return Err(message);
    }
    Ok(DownloadPlan {
        repo,
        revision,
        commit: listing.commit,
        files,
        dest,
    })
}
