//! What the Chat panel does: conversations (new, select, rename, delete, export) and answers
//! (send, stop, regenerate, edit and resend, drop old turns when the context overflows).

use std::path::Path;
use std::time::Instant;

use backpack_engine::models::Prompt;
use eframe::egui;

use super::prompt::{
    drop_oldest_turn, file_stem_for, generate_params, prompt_for, remote_params, title_from,
};
use super::{ChatPanel, Generation, Overflow};
use crate::gui::services::remote::RemoteModelRef;
use crate::gui::shared::DialogKind;
use crate::gui::shared::{ModelState, Shared};
use crate::gui::store::{self, Conversation, Message, Role};

impl ChatPanel {
    /// The panel for `shared`'s conversations: the one selected last time, or a new one.
    pub fn new(shared: &mut Shared) -> Self {
        let mut panel = Self {
            selected: None,
            input: String::new(),
            search: String::new(),
            renaming: None,
            editing: None,
            show_settings: false,
            focus_composer: true,
            md_cache: Default::default(),
            active: None,
            pending_send: None,
            overflow: None,
            last_tokens_per_s: None,
            dictation: None,
            dictation_note: None,
            dictation_line: false,
        };
        let store = &mut shared.store;
        panel.selected = store
            .state
            .selected_conversation
            .filter(|id| store.conversation(*id).is_some());
        if store.conversations.is_empty() {
            panel.new_conversation(shared);
        } else if panel.selected.is_none() {
            panel.selected = store.conversations.last().map(|c| c.id);
            store.state.selected_conversation = panel.selected;
        }
        panel
    }

    pub fn selected_id(&self) -> Option<u64> {
        self.selected
    }

    pub fn selected<'a>(&self, shared: &'a Shared) -> Option<&'a Conversation> {
        self.selected.and_then(|id| shared.store.conversation(id))
    }

    /// The answer being streamed, if any.
    pub fn generation(&self) -> Option<&Generation> {
        self.active.as_ref()
    }

    pub fn is_busy(&self) -> bool {
        self.active.is_some()
    }

    /// The prompt that last did not fit the model's context, until it is retried.
    pub fn overflow(&self) -> Option<&Overflow> {
        self.overflow.as_ref()
    }

    pub fn select(&mut self, shared: &mut Shared, id: u64) {
        self.selected = Some(id);
        self.editing = None;
        shared.store.state.selected_conversation = Some(id);
        shared.store.mark_dirty();
    }

    /// A new conversation with the model in use: the selected conversation's remote model if
    /// it has one, else the local model.
    pub fn new_conversation(&mut self, shared: &mut Shared) -> u64 {
        let model = shared.model_path().map(Path::to_owned);
        let remote = self.selected(shared).and_then(|c| c.remote.clone());
        let store = &mut shared.store;
        let id = store.next_conversation_id();
        let mut conversation = Conversation::new(id, store.state.default_sampling.clone(), model);
        conversation.remote = remote;
        store.conversations.push(conversation);
        self.select(shared, id);
        self.focus_composer = true;
        id
    }

    pub fn delete_conversation(&mut self, shared: &mut Shared, id: u64) {
        if self.active.as_ref().is_some_and(|g| g.conversation == id) {
            self.stop(shared);
        }
        let store = &mut shared.store;
        store.conversations.retain(|c| c.id != id);
        if self.selected == Some(id) {
            self.selected = store.conversations.last().map(|c| c.id);
            store.state.selected_conversation = self.selected;
        }
        if store.conversations.is_empty() {
            self.new_conversation(shared);
        }
        shared.store.mark_dirty();
    }

    /// Renames conversation `id`; a blank title is ignored.
    pub fn rename(&mut self, shared: &mut Shared, id: u64, title: &str) {
        if let Some(c) = shared.store.conversation_mut(id)
            && !title.trim().is_empty()
        {
            c.title = title.trim().to_owned();
            shared.store.mark_dirty();
        }
    }

    /// Asks where to export conversation `id` (the dialog's answer goes to `finish_export`).
    pub(super) fn open_export(&self, shared: &mut Shared, kind: DialogKind, ctx: &egui::Context) {
        let id = match kind {
            DialogKind::ExportMarkdown(id) | DialogKind::ExportJson(id) => id,
            _ => return,
        };
        let name = shared
            .store
            .conversation(id)
            .map_or_else(|| "chat".into(), |c| file_stem_for(&c.title));
        shared.open_dialog(kind, &name, ctx);
    }

    /// Exports conversation `id` to the path chosen in the dialog, with a notice either way.
    pub fn finish_export(&self, shared: &mut Shared, id: u64, path: &Path, json: bool) {
        let notice = match self.export_conversation(shared, id, path, json) {
            Ok(()) => format!("Exported to {}", path.display()),
            Err(e) => format!("Export failed: {e:#}"),
        };
        shared.notices.push(notice);
    }

    /// Writes conversation `id` to `path` as JSON or Markdown.
    pub fn export_conversation(
        &self,
        shared: &Shared,
        id: u64,
        path: &Path,
        json: bool,
    ) -> anyhow::Result<()> {
        let conv = shared
            .store
            .conversation(id)
            .ok_or_else(|| anyhow::anyhow!("no conversation {id}"))?;
        let bytes = if json {
            serde_json::to_vec_pretty(conv)?
        } else {
            conv.to_markdown().into_bytes()
        };
        store::write_atomic(path, &bytes)
    }

    /// Sends the composer's text to the selected conversation and answers it.
    pub fn submit_input(&mut self, shared: &mut Shared) {
        let text = self.input.trim().to_owned();
        if text.is_empty() || self.active.is_some() {
            return;
        }
        let id = match self.selected {
            Some(id) => id,
            None => self.new_conversation(shared),
        };
        self.input.clear();
        let Some(conv) = shared.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.is_empty() && conv.title == "New chat" {
            conv.title = title_from(&text);
        }
        conv.messages.push(Message::user(&text));
        shared.store.mark_dirty();
        self.answer(shared, id);
    }

    /// Streams a new answer to conversation `id`, whose last message is from the user. Loads
    /// the conversation's model first when none is loaded.
    pub fn answer(&mut self, shared: &mut Shared, id: u64) {
        self.overflow = None;
        if let Some(remote) = shared.store.conversation(id).and_then(|c| c.remote.clone()) {
            self.answer_remotely(shared, id, &remote);
            return;
        }
        let info = match &shared.model {
            ModelState::Ready { info, .. } => info.clone(),
            ModelState::Loading(_) => {
                self.pending_send = Some(id);
                return;
            }
            ModelState::None => {
                let wanted = shared.store.conversation(id).and_then(|c| c.model.clone());
                match wanted {
                    Some(path) if path.exists() => {
                        shared.load_model(&path);
                        self.pending_send = Some(id);
                    }
                    _ => {
                        shared.model_error = Some(
                            "Open a model first: Models, then Open model… (or pick a remote one after adding it in Settings → Backends)."
                                .into(),
                        );
                    }
                }
                return;
            }
        };
        let model_path = shared.model_path().map(Path::to_owned);
        let Some(engine) = &mut shared.engine else {
            return;
        };
        let Some(conv) = shared.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.last().map(|m| m.role) != Some(Role::User) {
            return;
        }
        conv.model = model_path;
        let prompt = prompt_for(conv, info.has_chat_template);
        let params = generate_params(&conv.sampling);
        conv.messages.push(Message::assistant());
        let message = conv.messages.len() - 1;
        let request = engine.generate(prompt, params);
        self.active = Some(Generation {
            request,
            remote: false,
            conversation: id,
            message,
            started: Instant::now(),
            first_token: None,
            tokens: 0,
            truncating: false,
        });
        shared.store.mark_dirty();
    }

    /// Streams a new answer to conversation `id` from `model` on a remote backend; the
    /// server applies the chat template.
    fn answer_remotely(&mut self, shared: &mut Shared, id: u64, model: &RemoteModelRef) {
        let Some(remote) = &shared.remote else {
            shared.model_error = Some("Remote backends are unavailable.".into());
            return;
        };
        let Some(conv) = shared.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.last().map(|m| m.role) != Some(Role::User) {
            return;
        }
        let Prompt::Chat(messages) = prompt_for(conv, true) else {
            return;
        };
        let request = match remote.generate(model, messages, remote_params(&conv.sampling)) {
            Ok(request) => request,
            Err(e) => {
                shared.model_error = Some(e);
                return;
            }
        };
        conv.messages.push(Message::assistant());
        self.active = Some(Generation {
            request,
            remote: true,
            conversation: id,
            message: conv.messages.len() - 1,
            started: Instant::now(),
            first_token: None,
            tokens: 0,
            truncating: false,
        });
        shared.model_error = None;
        shared.store.mark_dirty();
    }

    /// Stops the answer being streamed; it ends within one token.
    pub fn stop(&self, shared: &Shared) {
        let Some(g) = &self.active else { return };
        if g.remote {
            if let Some(remote) = &shared.remote {
                remote.cancel(g.request);
            }
        } else if let Some(engine) = &shared.engine {
            engine.cancel(g.request);
        }
    }

    /// Replaces the last answer of conversation `id` with a new one.
    pub fn regenerate(&mut self, shared: &mut Shared, id: u64) {
        if self.active.is_some() {
            return;
        }
        let Some(conv) = shared.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.last().map(|m| m.role) == Some(Role::Assistant) {
            conv.messages.pop();
        }
        self.answer(shared, id);
    }

    /// Replaces user message `index` of conversation `id` with `text`, drops everything after
    /// it, and answers again.
    pub fn edit_and_resend(&mut self, shared: &mut Shared, id: u64, index: usize, text: &str) {
        if self.active.is_some() {
            self.stop(shared);
            // The cancelled answer's Done event must not land in the edited transcript.
            self.active = None;
        }
        let Some(conv) = shared.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.get(index).map(|m| m.role) != Some(Role::User) {
            return;
        }
        conv.messages.truncate(index + 1);
        conv.messages[index].content = text.trim().to_owned();
        self.editing = None;
        shared.store.mark_dirty();
        self.answer(shared, id);
    }

    /// Drops the oldest exchange of conversation `id` (keeping the system prompt and the last
    /// user message) and retries; repeats while the prompt still overflows.
    pub fn drop_oldest_and_retry(&mut self, shared: &mut Shared, id: u64) {
        self.overflow = None;
        if !drop_oldest_turn(shared.store.conversation_mut(id)) {
            shared.model_error = Some(
                "The last message alone is longer than the model's context; shorten it or raise the context length in Models."
                    .into(),
            );
            return;
        }
        shared.store.mark_dirty();
        self.answer(shared, id);
        if let Some(g) = self.active.as_mut().filter(|g| g.conversation == id) {
            g.truncating = true;
        }
    }
}
