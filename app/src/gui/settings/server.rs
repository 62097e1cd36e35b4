//! Settings → Local server: the switch that runs `backpack serve` inside the app, on
//! 127.0.0.1, over the models loaded in Chat, Speech and Image.

use std::path::PathBuf;

use eframe::egui;

use crate::gui::services::server::{ServerLink, ServerState};
use crate::gui::services::text;
use crate::gui::shared::{ModelState, Shared};
use crate::serve::{ServeOptions, SharedText};

const DEFAULT_PORT: u16 = 8080;

#[derive(Default)]
pub struct ServerSwitch {
    link: ServerLink,
    /// The server answers through the chat's engine (its first model is the chat's, and
    /// follows the chat's loads).
    shares_chat: bool,
    /// The key being typed; read from the data folder once.
    key: Option<String>,
    problem: Option<String>,
}

fn key_path(shared: &Shared) -> PathBuf {
    shared.config.data_dir.join("server-key")
}

impl ServerSwitch {
    pub fn show(&mut self, ui: &mut egui::Ui, shared: &mut Shared) {
        let mut key = self.key.take().unwrap_or_else(|| {
            std::fs::read_to_string(key_path(shared))
                .map(|k| k.trim().to_owned())
                .unwrap_or_default()
        });
        self.group(ui, shared, &mut key);
        self.key = Some(key);
    }

    fn group(&mut self, ui: &mut egui::Ui, shared: &mut Shared, key: &mut String) {
        ui.group(|ui| {
            ui.label(egui::RichText::new("Local server").strong());
            ui.weak(
                "Serves the models loaded in Chat, Speech and Image over OpenAI's API on this computer only (127.0.0.1), for editors, scripts and agents. The chat's model answers the server too (one copy on the GPU); the speech and image models are loaded a second time.",
            );
            let running = self.link.is_on();
            let mut port = shared.store.state.server_port.unwrap_or(DEFAULT_PORT);
            let mut switch = running;
            ui.horizontal(|ui| {
                ui.checkbox(&mut switch, "Serve the OpenAI API");
                ui.label("Port");
                ui.add_enabled(!running, egui::DragValue::new(&mut port).range(1..=65535))
                    .on_hover_text("Server port");
                ui.add_enabled(
                    !running,
                    egui::TextEdit::singleline(key)
                        .password(true)
                        .hint_text("API key (optional)")
                        .desired_width(160.0),
                )
                .on_hover_text("Server API key: required as Authorization: Bearer when set");
            });
            if Some(port) != shared.store.state.server_port && port != DEFAULT_PORT {
                shared.store.state.server_port = Some(port);
                shared.store.mark_dirty();
            }
            if switch && !running {
                let key = key.trim().to_owned();
                self.problem = self.start(shared, port, key, ui.ctx()).err();
            } else if !switch && running {
                self.link.stop();
            }
            match self.link.state() {
                ServerState::Off => {}
                ServerState::Starting => {
                    ui.horizontal(|ui| {
                        ui.spinner();
                        ui.label("Loading the models to serve…");
                    });
                }
                ServerState::Running { url, mut models } => {
                    if let (true, ModelState::Ready { info, .. }, Some(first)) =
                        (self.shares_chat, &shared.model, models.first_mut())
                    {
                        first.clone_from(&info.name);
                    }
                    ui.label(format!("Serving {} at {url}", models.join(", ")));
                }
                ServerState::Failed(e) => {
                    ui.colored_label(ui.visuals().error_fg_color, e);
                }
            }
            if let Some(p) = &self.problem {
                ui.colored_label(ui.visuals().error_fg_color, p);
            }
        });
    }

    fn start(
        &mut self,
        shared: &Shared,
        port: u16,
        key: String,
        ctx: &egui::Context,
    ) -> Result<(), String> {
        let gpu = text::shared_gpu(shared.render_state.as_ref())
            .filter(|_| shared.engine.is_some())
            .ok_or_else(|| "There is no GPU to serve models on.".to_owned())?;
        let models: Vec<PathBuf> = [
            shared.model_path(),
            shared.speech_model_path(),
            shared.image_model_path(),
        ]
        .into_iter()
        .flatten()
        .map(std::path::Path::to_owned)
        .collect();
        if models.is_empty() {
            return Err(
                "Load a model first (Chat, Speech or Image); the server serves those.".into(),
            );
        }
        let path = key_path(shared);
        if key.is_empty() {
            let _ = std::fs::remove_file(&path);
        } else {
            backpack_engine::hub::write_owner_only(&path, key.as_bytes())
                .map_err(|e| format!("saving the key to {}: {e}", path.display()))?;
        }
        let opts = ServeOptions {
            port,
            api_key: Some(key).filter(|k| !k.is_empty()),
            ..Default::default()
        };
        // The chat's model answers the server's requests too, through the chat's engine.
        let text = match (&shared.model, &shared.engine) {
            (ModelState::Ready { path, info, .. }, Some(engine)) => {
                let (engine, events) = engine.share();
                Some(SharedText {
                    path: path.clone(),
                    info: info.clone(),
                    engine,
                    events,
                })
            }
            _ => None,
        };
        self.shares_chat = text.is_some();
        self.link
            .start(gpu, models, shared.load_options(), opts, text, ctx);
        Ok(())
    }

    pub fn stop(&mut self) {
        self.link.stop();
    }
}
