//! `backpack listen`: live captions in the terminal from a microphone, or from a file played
//! at real-time pace through the same pipeline (a virtual microphone).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Result, bail};
use backpack_engine::models::whisper::{TranscribeOptions, WhisperOptions};
use backpack_engine::runtime::ListenOptions;
use backpack_engine::runtime::speech::{LiveSource, SpeechEvent, SpeechService};
use clap::Args;

use super::DTypeArg;
use super::transcribe::TaskArg;

#[derive(Args)]
pub struct ListenArgs {
    /// A Whisper model folder (HF layout) or the repo id of an installed one.
    #[arg(long)]
    model: PathBuf,
    /// The input device: a part of its name (default: the system's default input).
    #[arg(long, conflicts_with = "audio_input")]
    device: Option<String>,
    /// Play this audio file through the live pipeline at real-time pace instead of a device.
    #[arg(long)]
    audio_input: Option<PathBuf>,
    /// Playback speed of --audio-input (1 = real time).
    #[arg(long, default_value_t = 1.0, hide = true)]
    pace: f64,
    /// Spoken language (code or name), or auto to detect it from the first words.
    #[arg(long, default_value = "auto")]
    language: String,
    #[arg(long, value_enum, default_value = "transcribe")]
    task: TaskArg,
    #[arg(long, value_enum, default_value = "f16")]
    dtype: DTypeArg,
    /// One JSON line per event: partial and committed text, then the whole text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ListenArgs, adapter: Option<&str>) -> Result<()> {
    let model = super::generate::resolve_model(&args.model)?;
    let gpu = super::open_gpu(adapter)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let _guard = runtime.enter();
    let (speech, mut events) = SpeechService::spawn(gpu, None);
    speech.load(
        model,
        WhisperOptions {
            dtype: args.dtype.into(),
            quantize: None,
        },
    );
    match events.blocking_recv() {
        Some(SpeechEvent::Loaded(info)) => eprintln!("loaded {}", info.name),
        Some(SpeechEvent::Error { message, .. }) => bail!(message),
        other => bail!("the speech service stopped unexpectedly: {other:?}"),
    }
    let source = match &args.audio_input {
        Some(path) => LiveSource::File {
            path: path.clone(),
            pace: args.pace,
        },
        None => LiveSource::Microphone(args.device.clone()),
    };
    let options = ListenOptions {
        transcribe: TranscribeOptions {
            language: Some(args.language.clone()),
            task: args.task.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let id = speech.listen(source, options);
    let handle = speech.clone();
    // Ctrl+C ends the capture but keeps what was said.
    runtime.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            handle.cancel(id);
        }
    });
    let tty = std::io::stderr().is_terminal() && !args.json;
    let mut out = std::io::stdout().lock();
    while let Some(event) = events.blocking_recv() {
        match event {
            SpeechEvent::Listening { input, .. } => {
                eprintln!("listening to {input} (Ctrl+C stops)")
            }
            SpeechEvent::Partial {
                t,
                start,
                end,
                text,
                ..
            } => {
                if args.json {
                    let line = serde_json::json!({"type": "partial", "t": t, "start": start, "end": end, "text": text});
                    writeln!(out, "{line}")?;
                } else if tty {
                    eprint!("\r\x1b[2K\x1b[2m{text}\x1b[0m");
                }
            }
            SpeechEvent::Commit {
                t,
                start,
                end,
                text,
                ..
            } => {
                if args.json {
                    let line = serde_json::json!({"type": "commit", "t": t, "start": start, "end": end, "text": text});
                    writeln!(out, "{line}")?;
                } else {
                    if tty {
                        eprint!("\r\x1b[2K");
                    }
                    writeln!(out, "[{start:7.2} → {end:7.2}] {text}")?;
                }
            }
            SpeechEvent::Done { text, .. } => {
                if tty {
                    eprint!("\r\x1b[2K");
                }
                if args.json {
                    writeln!(out, "{}", serde_json::json!({"type": "done", "text": text}))?;
                }
                break;
            }
            SpeechEvent::Error { message, .. } => bail!(message),
            _ => {}
        }
        out.flush()?;
    }
    Ok(())
}
