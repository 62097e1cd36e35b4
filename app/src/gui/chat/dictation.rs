//! Dictation into the composer: live captions with the speech model loaded in Speech. Each
//! committed piece is appended to what is being typed; the partial text is shown as a hint.

use backpack_engine::runtime::speech::SpeechEvent;

use super::ChatPanel;
use crate::gui::shared::Shared;

/// A dictation under way.
pub struct Dictation {
    pub request: u64,
    /// Words that may still change.
    pub partial: String,
    /// Stop was pressed; the last words are being committed.
    pub stopping: bool,
}

impl ChatPanel {
    /// The speech request dictating into the composer, until it is done.
    pub fn dictation_request(&self) -> Option<u64> {
        self.dictation.as_ref().map(|d| d.request)
    }

    pub fn dictation(&self) -> Option<&Dictation> {
        self.dictation.as_ref()
    }

    /// Why dictation did not start or what stopped it.
    pub fn dictation_note(&self) -> Option<&str> {
        self.dictation_note.as_deref()
    }

    /// Starts dictating, or stops (keeping what was said) when already dictating.
    pub fn toggle_dictation(&mut self, shared: &mut Shared) {
        if self.dictation.is_some() {
            self.stop_dictation(shared);
            return;
        }
        match shared.start_listening() {
            Ok(request) => {
                self.dictation = Some(Dictation {
                    request,
                    partial: String::new(),
                    stopping: false,
                });
                self.dictation_note = None;
                self.focus_composer = true;
            }
            Err(reason) => self.dictation_note = Some(reason),
        }
    }

    pub fn stop_dictation(&mut self, shared: &Shared) {
        if let Some(d) = &mut self.dictation {
            shared.cancel_speech(d.request);
            d.stopping = true;
        }
    }

    /// An event of the dictation's request.
    pub fn on_speech_event(&mut self, event: SpeechEvent) {
        let Some(d) = &mut self.dictation else { return };
        match event {
            SpeechEvent::Partial { text, .. } => d.partial = text,
            SpeechEvent::Commit { text, .. } => append_words(&mut self.input, &text),
            SpeechEvent::Done { .. } => self.dictation = None,
            SpeechEvent::Error { message, .. } => {
                self.dictation = None;
                self.dictation_note = Some(message);
            }
            _ => {}
        }
    }
}

/// Appends `text` to `input`, a space between them where needed.
fn append_words(input: &mut String, text: &str) {
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    if !input.is_empty() && !input.ends_with(char::is_whitespace) {
        input.push(' ');
    }
    input.push_str(text);
}

#[cfg(test)]
mod tests {
    use super::append_words;

    #[test]
    fn dictated_words_are_spaced() {
        let mut input = String::new();
        append_words(&mut input, " Hello");
        append_words(&mut input, "world. ");
        append_words(&mut input, "  ");
        assert_eq!(input, "Hello world.");
        let mut typed = String::from("Note:\n");
        append_words(&mut typed, "buy milk");
        assert_eq!(typed, "Note:\nbuy milk");
    }
}
