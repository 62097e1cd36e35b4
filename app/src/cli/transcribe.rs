//! `backpack transcribe`: an audio file to text with a Whisper model.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use backpack_engine::models::whisper::{
    Progress, Segment, Task, TranscribeOptions, Transcriber, Transcript, WhisperModel,
    WhisperOptions, subtitles,
};
use backpack_engine::remote::media::RemoteAudio;
use clap::{Args, ValueEnum};

use super::DTypeArg;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TaskArg {
    Transcribe,
    Translate,
}

impl From<TaskArg> for Task {
    fn from(t: TaskArg) -> Self {
        match t {
            TaskArg::Transcribe => Task::Transcribe,
            TaskArg::Translate => Task::Translate,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum FormatArg {
    Txt,
    Srt,
    Vtt,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SpeechQuantArg {
    #[value(name = "q8_0")]
    Q8_0,
}

#[derive(Args)]
pub struct TranscribeArgs {
    /// A Whisper model folder (HF layout) or the repo id of an installed one; with --endpoint,
    /// the name of one of the server's models (e.g. whisper-1).
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
    /// The audio file: WAV, FLAC, MP3, Ogg/Vorbis or M4A/AAC, any rate and channel count.
    #[arg(long)]
    audio: PathBuf,
    /// Spoken language (code or name), or auto to detect it.
    #[arg(long, default_value = "auto")]
    language: String,
    #[arg(long, value_enum, default_value = "transcribe")]
    task: TaskArg,
    /// Plain text without timestamp tokens (one segment per window).
    #[arg(long)]
    no_timestamps: bool,
    /// Decode once at the given temperature; no retries at higher temperatures.
    #[arg(long)]
    no_fallback: bool,
    /// First decoding temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Storage type of the weights (arithmetic is f32 either way).
    #[arg(long, value_enum, default_value = "f16")]
    dtype: DTypeArg,
    /// Quantize weight matrices while loading.
    #[arg(long, value_enum, conflicts_with = "endpoint")]
    quant: Option<SpeechQuantArg>,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value = "txt")]
    format: FormatArg,
    /// Print one last JSON line with ids, text, segments and timings.
    #[arg(long)]
    json: bool,
    /// Text that precedes the audio (names, spelling) given to the first window as context.
    #[arg(long)]
    prompt: Option<String>,
    /// At most this many tokens decoded per 30 s window (default: as many as the decoder
    /// holds, 448 positions for every Whisper, less the prompt); with --endpoint, sent as the
    /// form field max_new_tokens, which Backpack's server reads.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_new_tokens: Option<u32>,
}

pub fn options(args: &TranscribeArgs) -> TranscribeOptions {
    let mut temperatures = vec![args.temperature.max(0.0)];
    let mut t = args.temperature.max(0.0);
    while t < 1.0 - 1e-6 {
        t = (t + 0.2).min(1.0);
        temperatures.push((t * 10.0).round() / 10.0);
    }
    let opts = TranscribeOptions {
        language: Some(args.language.clone()),
        task: args.task.into(),
        timestamps: !args.no_timestamps,
        temperatures,
        initial_prompt: args.prompt.clone(),
        max_new_tokens: args.max_new_tokens,
        ..Default::default()
    };
    if args.no_fallback {
        opts.without_fallback()
    } else {
        opts
    }
}

pub fn run(args: TranscribeArgs, adapter: Option<&str>) -> Result<()> {
    if let Some(url) = &args.remote.endpoint {
        return run_remote(&args, url);
    }
    let model_dir = super::generate::resolve_model(&args.model)?;
    let gpu = super::open_gpu(adapter)?;
    let started = Instant::now();
    let samples = backpack_engine::audio::load_file(&args.audio)?;
    let load_opts = WhisperOptions {
        dtype: args.dtype.into(),
        quantize: args
            .quant
            .map(|SpeechQuantArg::Q8_0| backpack_engine::load::GgmlType::Q8_0),
    };
    let mut model = WhisperModel::load(&gpu, &model_dir, &load_opts)
        .with_context(|| format!("loading {}", model_dir.display()))?;
    let info = model.info();
    eprintln!(
        "loaded {} ({:.0} M parameters, {:.0} MiB of weights as {}) in {:.2} s",
        info.name,
        info.parameters as f64 / 1e6,
        info.weight_bytes as f64 / f64::from(1u32 << 20),
        info.dtype,
        started.elapsed().as_secs_f64()
    );
    let began = Instant::now();
    let mut transcriber = Transcriber::new(&mut model, options(&args))?;
    let transcript = transcriber.run(&samples, &|| false, &mut |p| match p {
        Progress::Language { code, probability } => {
            eprintln!("detected language: {code} ({:.0} %)", probability * 100.0)
        }
        Progress::Segment(s) if args.format == FormatArg::Txt && !args.json => {
            eprintln!("[{:8.2} → {:8.2}] {}", s.start, s.end, s.text)
        }
        _ => {}
    })?;
    let elapsed = began.elapsed().as_secs_f64();
    eprintln!(
        "{:.1} s of audio in {elapsed:.2} s (real-time factor {:.3}), {} windows",
        transcript.audio_s,
        real_time_factor(elapsed, transcript.audio_s),
        transcript.windows
    );
    print_transcript(&transcript, &args, elapsed)
}

fn real_time_factor(elapsed: f64, audio_s: f64) -> f64 {
    if audio_s > 0.0 {
        elapsed / audio_s
    } else {
        0.0
    }
}

/// The transcript on stdout in `--format`, then the `--json` line.
fn print_transcript(transcript: &Transcript, args: &TranscribeArgs, elapsed: f64) -> Result<()> {
    match args.format {
        FormatArg::Txt => println!("{}", transcript.text),
        FormatArg::Srt => print!("{}", subtitles::to_srt(&transcript.segments)),
        FormatArg::Vtt => print!("{}", subtitles::to_vtt(&transcript.segments)),
        FormatArg::Json => println!("{}", subtitles::to_json(transcript)),
    }
    if args.json {
        let line = serde_json::json!({
            "prompt_tokens": transcript.prompt_tokens,
            "tokens": transcript.tokens,
            "text": transcript.text,
            "segments": transcript.segments,
            "language": transcript.language,
            "audio_s": transcript.audio_s,
            "elapsed_s": elapsed,
            "rtf": real_time_factor(elapsed, transcript.audio_s),
        });
        println!("{line}");
    }
    Ok(())
}

/// The transcript from `--endpoint`'s model; the server decodes the file. Servers that give no
/// segment timings get one segment spanning the audio.
fn run_remote(args: &TranscribeArgs, url: &str) -> Result<()> {
    let language = Some(args.language.trim())
        .filter(|l| !l.is_empty() && !l.eq_ignore_ascii_case("auto"))
        .map(str::to_owned);
    let request = RemoteAudio {
        language,
        prompt: args.prompt.clone(),
        temperature: Some(args.temperature),
        translate: matches!(args.task, TaskArg::Translate),
        max_new_tokens: args.max_new_tokens,
        ..Default::default()
    };
    let model = args.model.to_string_lossy();
    let (remote, elapsed) =
        super::remote::transcribe(&args.remote, url, &model, &args.audio, request)?;
    let audio_s = remote
        .duration
        .or_else(|| remote.segments.last().map(|s| s.end))
        .unwrap_or(0.0);
    let text = remote.text.trim().to_owned();
    let mut segments: Vec<Segment> = remote
        .segments
        .into_iter()
        .map(|s| segment(s.start, s.end, s.text.trim()))
        .collect();
    if segments.is_empty() && !text.is_empty() {
        segments.push(segment(0.0, audio_s, &text));
    }
    let transcript = Transcript {
        language: remote.language,
        segments,
        text,
        audio_s,
        ..Default::default()
    };
    eprintln!("{url}: {audio_s:.1} s of audio in {elapsed:.2} s");
    print_transcript(&transcript, args, elapsed)
}

fn segment(start: f64, end: f64, text: &str) -> Segment {
    Segment {
        start,
        end,
        text: text.to_owned(),
        tokens: Vec::new(),
        avg_logprob: 0.0,
        no_speech_prob: 0.0,
        temperature: 0.0,
    }
}
