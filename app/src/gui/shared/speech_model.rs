//! The speech model the Speech panel and chat dictation share: what is loaded, how it is
//! loaded, and the options every transcription and recording is started with.

use std::path::Path;

use backpack_engine::models::whisper::{
    SpeechModelInfo, Task, TranscribeOptions, WhisperOptions, is_whisper_dir,
};
use backpack_engine::ops::WeightDType;
use backpack_engine::runtime::ListenOptions;
use backpack_engine::runtime::speech::{AudioSource, LiveSource};

use super::Shared;
use crate::gui::common::display_name;
use crate::gui::services::speech::{SpeechLink, SpeechModelState};

impl Shared {
    pub fn speech_info(&self) -> Option<&SpeechModelInfo> {
        match &self.speech_model {
            SpeechModelState::Ready { info, .. } => Some(info),
            _ => None,
        }
    }

    /// The speech model loaded or loading.
    pub fn speech_model_path(&self) -> Option<&Path> {
        match &self.speech_model {
            SpeechModelState::Ready { path, .. } | SpeechModelState::Loading(path) => Some(path),
            SpeechModelState::None => None,
        }
    }

    /// Starts loading the Whisper folder `path`; transcriptions and recordings running are
    /// stopped (they keep what they have).
    pub fn load_speech_model(&mut self, path: &Path) {
        self.speech_error = None;
        let Some(speech) = &self.speech else {
            self.speech_error = self.engine_error.clone();
            return;
        };
        if !path.exists() {
            self.speech_error = Some(format!("{} does not exist", path.display()));
            return;
        }
        if !is_whisper_dir(path) {
            self.speech_error = Some(format!(
                "{} is not a Whisper model folder (its config.json should say model_type \"whisper\")",
                path.display()
            ));
            return;
        }
        speech.cancel_all();
        let dtype = if self.store.state.speech.dtype == "f32" {
            WeightDType::F32
        } else {
            WeightDType::F16
        };
        speech.handle.load(
            path.to_owned(),
            WhisperOptions {
                dtype,
                quantize: None,
            },
        );
        self.speech_model = SpeechModelState::Loading(path.to_owned());
    }

    pub fn unload_speech_model(&mut self) {
        if let Some(speech) = &self.speech {
            speech.cancel_all();
            speech.handle.unload();
        }
        self.speech_model = SpeechModelState::None;
    }

    /// The service finished loading: the model is ready and remembered.
    pub fn speech_loaded(&mut self, info: SpeechModelInfo) {
        let path = self.speech_model_path().map(Path::to_owned);
        let path = path.unwrap_or_default();
        self.store.state.speech.remember_model(&path);
        self.store.mark_dirty();
        self.speech_model = SpeechModelState::Ready { path, info };
        self.speech_error = None;
    }

    pub fn speech_failed(&mut self, message: String) {
        self.speech_model = SpeechModelState::None;
        self.speech_error = Some(message);
    }

    /// Language and task as chosen; translation only where the model can.
    pub fn transcribe_options(&self) -> TranscribeOptions {
        let settings = &self.store.state.speech;
        let multilingual = self.speech_info().is_some_and(|i| i.multilingual);
        TranscribeOptions {
            language: settings.language.clone(),
            task: if settings.translate && multilingual {
                Task::Translate
            } else {
                Task::Transcribe
            },
            max_new_tokens: self.speech_max_new_tokens,
            ..Default::default()
        }
    }

    /// Live input: the `--audio-input` file played in real time, else the chosen device.
    pub fn live_source(&self) -> LiveSource {
        match &self.config.audio_input {
            Some(path) => LiveSource::File {
                path: path.clone(),
                pace: 1.0,
            },
            None => LiveSource::Microphone(self.store.state.speech.device.clone()),
        }
    }

    /// How the `--audio-input` file is named where a device would be.
    pub fn virtual_input_name(&self) -> Option<String> {
        let path = self.config.audio_input.as_deref()?;
        Some(format!("File: {} (virtual microphone)", display_name(path)))
    }

    /// Starts live captions with the shared options; the reason why not when no model is
    /// ready.
    pub fn start_listening(&mut self) -> Result<u64, String> {
        if self.speech_info().is_none() {
            return Err(self.speech_not_ready());
        }
        let source = self.live_source();
        let options = ListenOptions {
            transcribe: self.transcribe_options(),
            ..Default::default()
        };
        let speech = self.idle_speech()?;
        Ok(speech.listen(source, options))
    }

    /// Queues `path` for transcription with the shared options.
    pub fn start_transcribing(&mut self, path: &Path) -> Result<u64, String> {
        if self.speech_info().is_none() {
            return Err(self.speech_not_ready());
        }
        let options = self.transcribe_options();
        let speech = self.idle_speech()?;
        Ok(speech.transcribe(AudioSource::File(path.to_owned()), options))
    }

    fn idle_speech(&mut self) -> Result<&mut SpeechLink, String> {
        match &mut self.speech {
            None => Err("the speech service is not running".into()),
            Some(s) if s.is_busy() => Err(
                "The speech model is busy (a recording, a file or dictation in Chat); stop that first"
                    .into(),
            ),
            Some(s) => Ok(s),
        }
    }

    pub fn cancel_speech(&self, request: u64) {
        if let Some(speech) = &self.speech {
            speech.cancel(request);
        }
    }

    /// Why nothing can be transcribed yet.
    pub fn speech_not_ready(&self) -> String {
        match &self.speech_model {
            SpeechModelState::Loading(path) => {
                format!("{} is still loading", display_name(path))
            }
            _ if self.speech.is_none() => self
                .engine_error
                .clone()
                .unwrap_or_else(|| "the speech service is not running".into()),
            _ => "Load a Whisper model in Speech first".into(),
        }
    }
}
