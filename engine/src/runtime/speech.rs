//! The speech service: one Whisper model, transcribing audio files (or samples already in
//! memory) on its own blocking task, streaming segments as windows finish.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::mpsc;

use super::live::{ListenOptions, listen};
use super::{WakeFn, guarded};
use crate::gpu::Gpu;
use crate::models::whisper::{
    Progress, Segment, SpeechModelInfo, TranscribeOptions, Transcriber, WhisperModel,
    WhisperOptions,
};

/// Where live audio comes from.
pub enum LiveSource {
    /// An input device: a part of its name, or the default one.
    Microphone(Option<String>),
    /// A file played at `pace` × real time (0: all at once).
    File { path: PathBuf, pace: f64 },
    /// Samples (16 kHz mono) played at `pace` × real time.
    Samples { samples: Vec<f32>, pace: f64 },
}

/// Where the audio of a transcription comes from.
pub enum AudioSource {
    File(PathBuf),
    /// 16 kHz mono samples.
    Samples(Vec<f32>),
}

pub enum SpeechRequest {
    Load {
        path: PathBuf,
        options: WhisperOptions,
    },
    Transcribe {
        id: u64,
        audio: AudioSource,
        options: TranscribeOptions,
    },
    /// Live captions until the input ends or the request is cancelled (Stop keeps what was
    /// said: the last words are committed).
    Listen {
        id: u64,
        source: LiveSource,
        options: ListenOptions,
    },
    Unload,
}

#[derive(Clone, Debug)]
pub enum SpeechEvent {
    Loaded(SpeechModelInfo),
    Language {
        request: u64,
        code: String,
        probability: f32,
    },
    Segment {
        request: u64,
        segment: Segment,
    },
    Progress {
        request: u64,
        done_s: f64,
        total_s: f64,
    },
    Listening {
        request: u64,
        input: String,
    },
    /// Loudness of the latest audio, time since listening began, and audio waiting to be
    /// transcribed (how far captions lag behind).
    Level {
        request: u64,
        rms: f32,
        elapsed_s: f64,
        lag_s: f64,
    },
    /// Text that may still change; replaces the previous partial text.
    Partial {
        request: u64,
        t: f64,
        start: f64,
        end: f64,
        text: String,
    },
    /// Text that will not change.
    Commit {
        request: u64,
        t: f64,
        start: f64,
        end: f64,
        text: String,
    },
    Done {
        request: u64,
        text: String,
        language: Option<String>,
        audio_s: f64,
        elapsed_s: f64,
        cancelled: bool,
    },
    Error {
        request: Option<u64>,
        message: String,
    },
}

/// The caller's side of the speech service.
#[derive(Clone)]
pub struct SpeechHandle {
    requests: mpsc::UnboundedSender<SpeechRequest>,
    next_id: Arc<AtomicU64>,
    cancelled_through: Arc<AtomicU64>,
}

impl SpeechHandle {
    pub fn load(&self, path: PathBuf, options: WhisperOptions) {
        let _ = self.requests.send(SpeechRequest::Load { path, options });
    }

    /// Queues a transcription and returns its request id.
    pub fn transcribe(&self, audio: AudioSource, options: TranscribeOptions) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel) + 1;
        let _ = self
            .requests
            .send(SpeechRequest::Transcribe { id, audio, options });
        id
    }

    /// Starts live captions and returns the request id.
    pub fn listen(&self, source: LiveSource, options: ListenOptions) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel) + 1;
        let _ = self.requests.send(SpeechRequest::Listen {
            id,
            source,
            options,
        });
        id
    }

    /// Cancels request `id` and any earlier one; a running transcription stops within a
    /// token and reports what it finished.
    pub fn cancel(&self, id: u64) {
        self.cancelled_through.fetch_max(id, Ordering::AcqRel);
    }

    pub fn unload(&self) {
        let _ = self.requests.send(SpeechRequest::Unload);
    }
}

pub struct SpeechService;

impl SpeechService {
    /// Starts the service on the current tokio runtime.
    pub fn spawn(
        gpu: Gpu,
        wake: Option<WakeFn>,
    ) -> (SpeechHandle, mpsc::UnboundedReceiver<SpeechEvent>) {
        let (req_tx, mut req_rx) = mpsc::unbounded_channel::<SpeechRequest>();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel::<SpeechEvent>();
        let cancelled_through = Arc::new(AtomicU64::new(0));
        let handle = SpeechHandle {
            requests: req_tx,
            next_id: Arc::new(AtomicU64::new(0)),
            cancelled_through: cancelled_through.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let send = |event: SpeechEvent| {
                let _ = ev_tx.send(event);
                if let Some(w) = &wake {
                    w();
                }
            };
            let mut model: Option<WhisperModel> = None;
            while let Some(request) = req_rx.blocking_recv() {
                match request {
                    SpeechRequest::Load { path, options } => {
                        model = None;
                        match guarded("loading the speech model", || {
                            WhisperModel::load(&gpu, &path, &options)
                        }) {
                            Ok(m) => {
                                send(SpeechEvent::Loaded(m.info()));
                                model = Some(m);
                            }
                            Err(e) => send(SpeechEvent::Error {
                                request: None,
                                message: e.to_string(),
                            }),
                        }
                    }
                    SpeechRequest::Unload => model = None,
                    SpeechRequest::Listen {
                        id,
                        source,
                        options,
                    } => {
                        let Some(m) = model.as_mut() else {
                            send(SpeechEvent::Error {
                                request: Some(id),
                                message: "no speech model is loaded".into(),
                            });
                            continue;
                        };
                        let cancelled = || cancelled_through.load(Ordering::Acquire) >= id;
                        let started = Instant::now();
                        let result = guarded("live transcription", || {
                            let input = open_live(source)?;
                            listen(m, id, input, &options, &cancelled, &send)
                        });
                        match result {
                            Ok(heard) => send(SpeechEvent::Done {
                                request: id,
                                text: heard.text,
                                language: heard.language,
                                audio_s: heard.audio_s,
                                elapsed_s: started.elapsed().as_secs_f64(),
                                cancelled: cancelled(),
                            }),
                            Err(e) => {
                                if matches!(e, crate::Error::Crashed(_)) {
                                    model = None;
                                }
                                send(SpeechEvent::Error {
                                    request: Some(id),
                                    message: e.to_string(),
                                });
                            }
                        }
                    }
                    SpeechRequest::Transcribe { id, audio, options } => {
                        let Some(m) = model.as_mut() else {
                            send(SpeechEvent::Error {
                                request: Some(id),
                                message: "no speech model is loaded".into(),
                            });
                            continue;
                        };
                        let cancelled = || cancelled_through.load(Ordering::Acquire) >= id;
                        let result = guarded("transcribing", || {
                            transcribe(m, id, audio, options, &cancelled, &send)
                        });
                        if let Err(e) = result {
                            if matches!(e, crate::Error::Crashed(_)) {
                                model = None;
                            }
                            send(SpeechEvent::Error {
                                request: Some(id),
                                message: e.to_string(),
                            });
                        }
                    }
                }
            }
        });
        (handle, ev_rx)
    }
}

fn open_live(source: LiveSource) -> Result<crate::audio::LiveInput, crate::Error> {
    use crate::audio::{LiveInput, Microphone, VirtualMicrophone};
    Ok(match source {
        LiveSource::Microphone(name) => {
            LiveInput::Microphone(Box::new(Microphone::open(name.as_deref())?))
        }
        LiveSource::File { path, pace } => LiveInput::File(VirtualMicrophone::open(&path, pace)?),
        LiveSource::Samples { samples, pace } => LiveInput::File(VirtualMicrophone::from_samples(
            samples,
            pace,
            "audio".into(),
        )),
    })
}

fn transcribe(
    model: &mut WhisperModel,
    id: u64,
    audio: AudioSource,
    options: TranscribeOptions,
    cancelled: &dyn Fn() -> bool,
    send: &dyn Fn(SpeechEvent),
) -> Result<(), crate::Error> {
    let started = Instant::now();
    let samples = match audio {
        AudioSource::File(path) => crate::audio::load_file(&path)?,
        AudioSource::Samples(s) => s,
    };
    let mut transcriber = Transcriber::new(model, options)?;
    let transcript = transcriber.run(&samples, cancelled, &mut |p| match p {
        Progress::Language { code, probability } => send(SpeechEvent::Language {
            request: id,
            code: code.to_owned(),
            probability,
        }),
        Progress::Segment(s) => send(SpeechEvent::Segment {
            request: id,
            segment: s.clone(),
        }),
        Progress::Position { done_s, total_s } => send(SpeechEvent::Progress {
            request: id,
            done_s,
            total_s,
        }),
    })?;
    send(SpeechEvent::Done {
        request: id,
        text: transcript.text,
        language: transcript.language,
        audio_s: transcript.audio_s,
        elapsed_s: started.elapsed().as_secs_f64(),
        cancelled: cancelled(),
    });
    Ok(())
}
