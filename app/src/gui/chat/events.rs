//! The text engine's events that concern chat: a model ready for a waiting conversation,
//! streamed tokens, finished answers and failed ones.

use std::path::Path;
use std::time::{Duration, Instant};

use backpack_engine::models::StopReason;
use backpack_engine::runtime::Event;

use super::{ChatPanel, Overflow};
use crate::gui::shared::Shared;
use crate::gui::store::AnswerStats;

impl ChatPanel {
    /// A model finished loading: an empty selected conversation adopts it (unless a remote
    /// model was picked for it), and a conversation waiting for it is answered.
    pub fn on_model_loaded(&mut self, shared: &mut Shared, path: &Path) {
        if let Some(conv) = self
            .selected
            .and_then(|id| shared.store.conversation_mut(id))
            && conv.messages.is_empty()
            && conv.remote.is_none()
        {
            conv.model = Some(path.to_owned());
        }
        if let Some(id) = self.pending_send.take() {
            self.answer(shared, id);
        }
    }

    pub fn on_model_failed(&mut self) {
        self.pending_send = None;
    }

    /// Tokens, ends and errors of generation requests from the local engine (`remote`
    /// false) or a remote backend; those of other requests are ignored.
    pub fn on_event(&mut self, shared: &mut Shared, event: Event, remote: bool) {
        if self.active.as_ref().is_some_and(|g| g.remote != remote) {
            return;
        }
        match event {
            Event::Token {
                request,
                text_delta,
                ..
            } => self.on_token(shared, request, &text_delta),
            Event::Done {
                request,
                prompt_tokens,
                generated_tokens,
                ttft,
                tokens_per_s,
                stop,
                ..
            } => {
                let stats = AnswerStats {
                    prompt_tokens,
                    tokens: generated_tokens,
                    ttft_ms: ttft.as_secs_f64() * 1e3,
                    tokens_per_s,
                    stop: stop_text(stop).into(),
                };
                self.on_done(shared, request, stats);
            }
            Event::Error {
                request: Some(request),
                message,
                prompt_too_long,
                ..
            } => self.on_error(shared, request, message, prompt_too_long),
            Event::Loaded(_) | Event::Error { request: None, .. } => {}
        }
    }

    fn on_token(&mut self, shared: &mut Shared, request: u64, text_delta: &str) {
        let Some(g) = self.active.as_mut().filter(|g| g.request == request) else {
            return;
        };
        g.tokens += 1;
        g.first_token.get_or_insert_with(Instant::now);
        if let Some(m) = shared
            .store
            .conversation_mut(g.conversation)
            .and_then(|c| c.messages.get_mut(g.message))
        {
            m.content.push_str(text_delta);
        }
    }

    fn on_done(&mut self, shared: &mut Shared, request: u64, stats: AnswerStats) {
        let Some(g) = self.active.take_if(|g| g.request == request) else {
            return;
        };
        self.last_tokens_per_s = Some(stats.tokens_per_s);
        if let Some(conv) = shared.store.conversation_mut(g.conversation) {
            conv.context_used = Some(stats.prompt_tokens + stats.tokens);
            if let Some(m) = conv.messages.get_mut(g.message) {
                m.stats = Some(stats);
            }
        }
        shared.store.mark_dirty();
        shared.save_now();
    }

    fn on_error(
        &mut self,
        shared: &mut Shared,
        request: u64,
        message: String,
        prompt_too_long: Option<(usize, u32)>,
    ) {
        let Some(g) = self.active.take_if(|g| g.request == request) else {
            return;
        };
        let Some(conv) = shared.store.conversation_mut(g.conversation) else {
            return;
        };
        match prompt_too_long {
            Some((tokens, capacity)) => {
                // Nothing was generated: drop the empty answer.
                if conv.messages.len() == g.message + 1
                    && conv.messages[g.message].content.is_empty()
                {
                    conv.messages.pop();
                }
                if g.truncating {
                    self.drop_oldest_and_retry(shared, g.conversation);
                } else {
                    self.overflow = Some(Overflow {
                        conversation: g.conversation,
                        tokens,
                        capacity,
                    });
                }
            }
            None => {
                if let Some(m) = conv.messages.get_mut(g.message) {
                    m.error = Some(message);
                }
            }
        }
        shared.store.mark_dirty();
    }

    /// Where the selected conversation's answers come from, when that is a remote backend
    /// (the status bar says so instead of naming the local model).
    pub fn remote_source(&self, shared: &Shared) -> Option<String> {
        let remote = self.selected(shared)?.remote.as_ref()?;
        let url = shared
            .remote
            .as_ref()
            .and_then(|r| r.backend(&remote.backend))
            .map_or_else(|| "not set up".to_owned(), |b| b.url.clone());
        Some(format!(
            "Remote: {} on {} ({url})",
            remote.model, remote.backend
        ))
    }

    /// The status bar's word on speed: live while an answer streams, else the last answer's.
    pub fn speed_text(&self) -> Option<String> {
        let Some(g) = &self.active else {
            return self
                .last_tokens_per_s
                .map(|r| format!("Last answer {r:.1} tokens/s"));
        };
        Some(match g.first_token {
            Some(first) => format!("{:.1} tokens/s", live_rate(g.tokens, first.elapsed())),
            None => "Reading the prompt…".into(),
        })
    }
}

/// Tokens per second since the first token (which ended the prompt's reading).
fn live_rate(tokens: usize, since_first: Duration) -> f64 {
    let secs = since_first.as_secs_f64();
    if secs > 0.0 && tokens > 1 {
        (tokens - 1) as f64 / secs
    } else {
        0.0
    }
}

fn stop_text(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndOfText => "end of text",
        StopReason::MaxTokens => "max tokens",
        StopReason::ContextFull => "context full",
        StopReason::Cancelled => "stopped",
    }
}
