//! Remote backends as the app keeps them: the OpenAI-compatible endpoints added in Settings
//! (saved readable by the user only, since they hold API keys), the models each lists, and the
//! engine's remote service that streams chat answers from them. It runs on its own small
//! runtime, so remote chat works even where no GPU could be opened.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backpack_engine::load::ChatMessage;
use backpack_engine::remote::{ChatParams, Endpoint};
use backpack_engine::runtime::Event;

pub use crate::gui::store::RemoteModelRef;
use backpack_engine::runtime::remote::{RemoteEvent, RemoteHandle, RemoteService};
use eframe::egui;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// One endpoint, as added in Settings → Backends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Backend {
    pub name: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
}

impl Backend {
    pub fn endpoint(&self) -> Result<Endpoint, String> {
        Endpoint::new(&self.url, self.api_key.clone()).map_err(|e| e.to_string())
    }
}

/// What a backend's `/v1/models` gave.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelList {
    Loading,
    Ready(Vec<String>),
    Failed(String),
}

#[derive(Default, Serialize, Deserialize)]
struct SavedBackends {
    backends: Vec<Backend>,
}

pub struct RemoteLink {
    pub backends: Vec<Backend>,
    /// By backend name.
    pub models: BTreeMap<String, ModelList>,
    path: PathBuf,
    handle: RemoteHandle,
    events: mpsc::UnboundedReceiver<RemoteEvent>,
    // Dropped last: the service's tasks run on it.
    _runtime: Arc<tokio::runtime::Runtime>,
}

impl RemoteLink {
    /// Starts the service and reads the saved backends from `data_dir`, asking each for its
    /// models. Returns why the saved list could not be read, if it could not.
    pub fn start(data_dir: &Path, ctx: &egui::Context) -> anyhow::Result<(Self, Option<String>)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("backpack-remote")
            .enable_all()
            .build()?;
        let wake_ctx = ctx.clone();
        let wake: backpack_engine::runtime::WakeFn = Arc::new(move || wake_ctx.request_repaint());
        let (handle, events) = {
            let _inside = runtime.enter();
            RemoteService::spawn(Some(wake))
        };
        let path = data_dir.join("backends.json");
        let (backends, problem) = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<SavedBackends>(&bytes) {
                Ok(saved) => (saved.backends, None),
                Err(e) => (
                    Vec::new(),
                    Some(format!(
                        "{} is not readable ({e}); no backends loaded",
                        path.display()
                    )),
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), None),
            Err(e) => (Vec::new(), Some(format!("reading {}: {e}", path.display()))),
        };
        let mut link = Self {
            backends,
            models: BTreeMap::new(),
            path,
            handle,
            events,
            _runtime: Arc::new(runtime),
        };
        for name in link.names() {
            link.refresh(&name);
        }
        Ok((link, problem))
    }

    fn names(&self) -> Vec<String> {
        self.backends.iter().map(|b| b.name.clone()).collect()
    }

    pub fn backend(&self, name: &str) -> Option<&Backend> {
        self.backends.iter().find(|b| b.name == name)
    }

    /// Adds (or replaces, by name) a backend, saves the list and asks it for its models.
    pub fn add(&mut self, backend: Backend) -> Result<(), String> {
        if backend.name.trim().is_empty() {
            return Err("give the backend a name".into());
        }
        backend.endpoint()?;
        let name = backend.name.clone();
        match self.backends.iter_mut().find(|b| b.name == name) {
            Some(existing) => *existing = backend,
            None => self.backends.push(backend),
        }
        self.save()?;
        self.refresh(&name);
        Ok(())
    }

    pub fn remove(&mut self, name: &str) -> Result<(), String> {
        self.backends.retain(|b| b.name != name);
        self.models.remove(name);
        self.save()
    }

    /// Asks backend `name` for its models again.
    pub fn refresh(&mut self, name: &str) {
        let Some(backend) = self.backend(name) else {
            return;
        };
        match backend.endpoint() {
            Ok(endpoint) => {
                self.handle.list_models(name, endpoint);
                self.models.insert(name.to_owned(), ModelList::Loading);
            }
            Err(e) => {
                self.models.insert(name.to_owned(), ModelList::Failed(e));
            }
        }
    }

    /// The list holds API keys: written readable by the user only.
    fn save(&self) -> Result<(), String> {
        let saved = SavedBackends {
            backends: self.backends.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&saved).map_err(|e| e.to_string())?;
        backpack_engine::hub::write_owner_only(&self.path, &bytes)
            .map_err(|e| format!("saving {}: {e}", self.path.display()))
    }

    /// Streams `model`'s answer; None (with the reason) when the backend is gone or invalid.
    pub fn generate(
        &self,
        model: &RemoteModelRef,
        messages: Vec<ChatMessage>,
        params: ChatParams,
    ) -> Result<u64, String> {
        let backend = self.backend(&model.backend).ok_or_else(|| {
            format!(
                "the backend {:?} is no longer set up (Settings → Backends)",
                model.backend
            )
        })?;
        let endpoint = backend.endpoint()?;
        Ok(self
            .handle
            .generate(endpoint, model.model.clone(), messages, params))
    }

    pub fn cancel(&self, id: u64) {
        self.handle.cancel(id);
    }

    /// Model lists are taken in; chat events are returned for the chat.
    pub fn drain(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            match event {
                RemoteEvent::Models { backend, result } => {
                    if self.backend(&backend).is_some() {
                        let list = match result {
                            Ok(models) => {
                                ModelList::Ready(models.into_iter().map(|m| m.id).collect())
                            }
                            Err(e) => ModelList::Failed(e),
                        };
                        self.models.insert(backend, list);
                    }
                }
                RemoteEvent::Text(event) => out.push(event),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_are_saved_for_the_owner_only() {
        let dir = std::env::temp_dir().join(format!("backpack-backends-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ctx = egui::Context::default();
        let (mut link, problem) = RemoteLink::start(&dir, &ctx).expect("start");
        assert_eq!(problem, None);
        assert!(
            link.add(Backend {
                name: " ".into(),
                url: "http://x".into(),
                api_key: None
            })
            .is_err()
        );
        assert!(
            link.add(Backend {
                name: "x".into(),
                url: "x:80".into(),
                api_key: None
            })
            .is_err()
        );
        let backend = Backend {
            name: "lab".into(),
            url: "http://127.0.0.1:9".into(),
            api_key: Some("sk-secret".into()),
        };
        link.add(backend.clone()).expect("add");
        let path = dir.join("backends.json");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path)
                .expect("saved")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        drop(link);
        let (mut again, problem) = RemoteLink::start(&dir, &ctx).expect("start");
        assert_eq!(problem, None);
        assert_eq!(again.backends, vec![backend]);
        again.remove("lab").expect("remove");
        assert!(again.backends.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
