//! `/v1/audio/transcriptions`, `/v1/audio/translations` (Whisper) and `/v1/images/generations`
//! (Stable Diffusion, `b64_json` PNGs). Each service takes one request at a time, in arrival
//! order, with at most `queue` waiting; a client that goes away cancels its own request (it
//! is the one running, so the service's "cancel through" touches nothing else).

use std::sync::Arc;

use axum::Json;
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Multipart, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use backpack_engine::models::diffusion::{ImageDefaults, ImageParams};
use backpack_engine::models::whisper::{Segment, Task, TranscribeOptions, subtitles};
use backpack_engine::runtime::image::ImageEvent;
use backpack_engine::runtime::speech::{AudioSource, SpeechEvent};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::api::ApiError;
use super::state::Server;

fn busy(n: usize) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "requests",
        format!("{n} requests are already running or queued; retry later"),
    )
    .with_code("rate_limit_exceeded")
}

fn missing(what: &str, how: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no {what} model is loaded (start the server with --model {how})"),
    )
    .with_code("model_not_found")
}

/// Cancels `id` through `cancel` unless defused (the request ran to its end).
struct CancelOnDrop<F: Fn(u64)> {
    id: u64,
    cancel: F,
    armed: bool,
}

impl<F: Fn(u64)> Drop for CancelOnDrop<F> {
    fn drop(&mut self) {
        if self.armed {
            (self.cancel)(self.id);
            eprintln!("request {}: the client went away; cancelled", self.id);
        }
    }
}

/// The fields of a transcription form.
#[derive(Default)]
struct AudioForm {
    file: Option<(String, Vec<u8>)>,
    language: Option<String>,
    prompt: Option<String>,
    format: Option<String>,
    temperature: Option<f32>,
    word_timestamps: bool,
    /// An extension to OpenAI's form: at most this many tokens per 30 s window.
    max_new_tokens: Option<u32>,
}

async fn read_form(mut form: Multipart) -> Result<AudioForm, ApiError> {
    let bad = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(e.status(), "invalid_request_error", e.body_text())
    };
    let mut out = AudioForm::default();
    while let Some(field) = form.next_field().await.map_err(bad)? {
        let name = field.name().unwrap_or_default().to_owned();
        if name == "file" {
            let file_name = field.file_name().unwrap_or("audio").to_owned();
            out.file = Some((file_name, field.bytes().await.map_err(bad)?.to_vec()));
            continue;
        }
        let text = field.text().await.map_err(bad)?;
        match name.as_str() {
            "language" => out.language = Some(text).filter(|t| !t.is_empty()),
            "prompt" => out.prompt = Some(text).filter(|t| !t.is_empty()),
            "response_format" => out.format = Some(text),
            "temperature" => {
                out.temperature = Some(text.trim().parse().map_err(|_| {
                    ApiError::bad_request("temperature must be a number", Some("temperature"))
                })?)
            }
            "max_new_tokens" => {
                let bad = || {
                    ApiError::bad_request(
                        "max_new_tokens must be a whole number from 1",
                        Some("max_new_tokens"),
                    )
                };
                let n = text.trim().parse::<u32>().ok().filter(|&n| n > 0);
                out.max_new_tokens = Some(n.ok_or_else(bad)?);
            }
            "timestamp_granularities[]" | "timestamp_granularities" => {
                out.word_timestamps |= text.contains("word")
            }
            _ => {}
        }
    }
    Ok(out)
}

type Form = Result<Multipart, MultipartRejection>;

pub async fn transcriptions(State(s): State<Arc<Server>>, form: Form) -> Response {
    audio(&s, form, Task::Transcribe)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn translations(State(s): State<Arc<Server>>, form: Form) -> Response {
    audio(&s, form, Task::Translate)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn audio(s: &Server, form: Form, task: Task) -> Result<Response, ApiError> {
    // The request is read and checked whole before anything else, so a malformed one gets the
    // same answer from every server.
    let form =
        form.map_err(|e| ApiError::new(e.status(), "invalid_request_error", e.body_text()))?;
    let form = read_form(form).await?;
    let Some((name, bytes)) = form.file else {
        return Err(ApiError::bad_request(
            "the form has no audio file",
            Some("file"),
        ));
    };
    let format = form.format.as_deref().unwrap_or("json").to_owned();
    if !["json", "text", "srt", "vtt", "verbose_json"].contains(&format.as_str()) {
        return Err(ApiError::bad_request(
            format!("response_format {format:?} is not one of json, text, srt, vtt, verbose_json"),
            Some("response_format"),
        ));
    }
    if form.word_timestamps {
        return Err(ApiError::bad_request(
            "word timestamps are not supported (segment timestamps are)",
            Some("timestamp_granularities"),
        ));
    }
    let mut options = TranscribeOptions {
        language: form.language,
        task,
        initial_prompt: form.prompt,
        max_new_tokens: form.max_new_tokens,
        ..Default::default()
    };
    // OpenAI's meaning: 0 (the default) decodes greedily and raises the temperature where a
    // window fails the quality checks; above 0, that one temperature, no fallback.
    match form.temperature {
        Some(t) if !(0.0..=1.0).contains(&t) => {
            return Err(ApiError::bad_request(
                "temperature must be between 0 and 1",
                Some("temperature"),
            ));
        }
        Some(t) if t > 0.0 => {
            options.temperatures = vec![t];
            options = options.without_fallback();
        }
        _ => {}
    }
    let Some(speech) = &s.speech else {
        return Err(missing("speech", "WHISPER_DIR"));
    };
    let Ok(permit) = speech.waiting.clone().try_acquire_owned() else {
        return Err(busy(speech.queue));
    };
    // The decoder probes the format from the bytes; the name's extension is a hint.
    let ext = std::path::Path::new(&name)
        .extension()
        .and_then(|e| e.to_str())
        .filter(|e| e.len() <= 5 && e.chars().all(char::is_alphanumeric))
        .unwrap_or("bin")
        .to_owned();
    let mut events = speech.events.lock().await;
    let upload = std::env::temp_dir().join(format!(
        "backpack-upload-{}-{}.{ext}",
        std::process::id(),
        UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&upload, &bytes).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("storing the upload: {e}"),
        )
    })?;
    let _remove = RemoveOnDrop(upload.clone());
    let id = speech
        .handle
        .transcribe(AudioSource::File(upload.clone()), options);
    let handle = speech.handle.clone();
    let mut guard = CancelOnDrop {
        id,
        cancel: move |id| handle.cancel(id),
        armed: true,
    };
    let mut segments: Vec<Segment> = Vec::new();
    let (text, language, duration) = loop {
        match events.recv().await {
            Some(SpeechEvent::Segment { request, segment }) if request == id => {
                segments.push(segment)
            }
            Some(SpeechEvent::Done {
                request,
                text,
                language,
                audio_s,
                ..
            }) if request == id => {
                break (text, language, audio_s);
            }
            Some(SpeechEvent::Error { request, message }) if request.is_none_or(|r| r == id) => {
                guard.armed = false;
                return Err(ApiError::bad_request(message, Some("file")));
            }
            Some(_) => {}
            None => {
                guard.armed = false;
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "the speech service stopped",
                ));
            }
        }
    };
    guard.armed = false;
    drop(permit);
    eprintln!(
        "request {id}: {duration:.1} s of audio, {} segments",
        segments.len()
    );
    let heard = Heard {
        task,
        text,
        language,
        duration,
        segments,
    };
    Ok(transcript_response(&format, &heard))
}

/// A finished transcription.
struct Heard {
    task: Task,
    text: String,
    language: Option<String>,
    duration: f64,
    segments: Vec<Segment>,
}

/// The body OpenAI sends for `format` (json, text, srt, vtt or verbose_json).
fn transcript_response(format: &str, t: &Heard) -> Response {
    let (task, text, language, duration, segments) =
        (t.task, &t.text, &t.language, t.duration, &t.segments);
    let body =
        |ctype: &'static str, text: String| ([(header::CONTENT_TYPE, ctype)], text).into_response();
    match format {
        "text" => body("text/plain; charset=utf-8", format!("{}\n", text.trim())),
        "srt" => body("text/plain; charset=utf-8", subtitles::to_srt(segments)),
        "vtt" => body("text/vtt; charset=utf-8", subtitles::to_vtt(segments)),
        "verbose_json" => Json(json!({
            "task": if task == Task::Translate { "translate" } else { "transcribe" },
            "language": language,
            "duration": duration,
            "text": text.trim(),
            "segments": segments.iter().enumerate().map(|(i, s)| json!({
                "id": i,
                "seek": 0,
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "tokens": s.tokens,
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "no_speech_prob": s.no_speech_prob,
            })).collect::<Vec<Value>>(),
        }))
        .into_response(),
        _ => Json(json!({"text": text.trim()})).into_response(),
    }
}

static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Removes an uploaded file once its request is over, however it ends.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[derive(Debug, Deserialize)]
pub struct ImageRequest {
    prompt: String,
    n: Option<u32>,
    size: Option<String>,
    response_format: Option<String>,
    /// Extensions (as other local servers take them).
    negative_prompt: Option<String>,
    steps: Option<u32>,
    guidance_scale: Option<f32>,
    seed: Option<u64>,
}

/// Checks an image request against the model's defaults.
fn image_params(
    r: ImageRequest,
    defaults: &ImageDefaults,
    size_step: u32,
) -> Result<(ImageParams, u32), ApiError> {
    if r.response_format
        .as_deref()
        .is_some_and(|f| f != "b64_json")
    {
        return Err(ApiError::bad_request(
            "only response_format b64_json is served (images are not hosted as URLs)",
            Some("response_format"),
        ));
    }
    let n = r.n.unwrap_or(1);
    if !(1..=8).contains(&n) {
        return Err(ApiError::bad_request(
            "n must be between 1 and 8",
            Some("n"),
        ));
    }
    let (width, height) = match r.size.as_deref() {
        None | Some("auto") => (defaults.width, defaults.height),
        Some(size) => size
            .split_once('x')
            .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)))
            .ok_or_else(|| {
                ApiError::bad_request(format!("size {size:?} is not WIDTHxHEIGHT"), Some("size"))
            })?,
    };
    let step = size_step.max(1);
    if width == 0
        || height == 0
        || width % step != 0
        || height % step != 0
        || width > 2048
        || height > 2048
    {
        return Err(ApiError::bad_request(
            format!("size must be multiples of {step} up to 2048 on a side"),
            Some("size"),
        ));
    }
    let steps = r.steps.unwrap_or(defaults.steps);
    if !(1..=150).contains(&steps) {
        return Err(ApiError::bad_request(
            "steps must be between 1 and 150",
            Some("steps"),
        ));
    }
    let params = ImageParams {
        prompt: r.prompt,
        negative: r.negative_prompt.unwrap_or_default(),
        steps,
        guidance: r.guidance_scale.unwrap_or(defaults.guidance),
        seed: r.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        }),
        width,
        height,
        scheduler: defaults.scheduler,
        init_image: None,
        init_latents: None,
    };
    Ok((params, n))
}

pub async fn images(
    State(s): State<Arc<Server>>,
    body: Result<Json<ImageRequest>, JsonRejection>,
) -> Response {
    image_inner(&s, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn image_inner(
    s: &Server,
    body: Result<Json<ImageRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Some((images, info)) = &s.image else {
        return Err(missing("image", "DIFFUSERS_DIR"));
    };
    let Json(request) = body.map_err(super::api::rejected)?;
    let (params, n) = image_params(request, &info.defaults, info.size_step)?;
    let Ok(permit) = images.waiting.clone().try_acquire_owned() else {
        return Err(busy(images.queue));
    };
    let mut events = images.events.lock().await;
    let id = images.handle.generate(params, n, false);
    let handle = images.handle.clone();
    let mut guard = CancelOnDrop {
        id,
        cancel: move |id| handle.cancel(id),
        armed: true,
    };
    let mut data = Vec::new();
    loop {
        match events.recv().await {
            Some(ImageEvent::Image {
                request,
                seed,
                params,
                image,
                ..
            }) if request == id => {
                let text = crate::image_files::parameters_text(&params, &images.model);
                let png =
                    crate::image_files::png_bytes(image.width, image.height, &image.rgb, &text)
                        .map_err(|e| {
                            ApiError::new(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "server_error",
                                e.to_string(),
                            )
                        })?;
                data.push(json!({
                    "b64_json": base64::engine::general_purpose::STANDARD.encode(png),
                    "revised_prompt": null,
                    "seed": seed,
                }));
            }
            Some(ImageEvent::Done { request, .. }) if request == id => break,
            Some(ImageEvent::Error { request, message }) if request.is_none_or(|r| r == id) => {
                guard.armed = false;
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    message,
                ));
            }
            Some(_) => {}
            None => {
                guard.armed = false;
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "the image service stopped",
                ));
            }
        }
    }
    guard.armed = false;
    drop(permit);
    eprintln!("request {id}: {} images", data.len());
    Ok(Json(json!({"created": super::api::unix_now(), "data": data})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response) -> (String, String) {
        let ctype = r.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap_or("")
            .to_owned();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        (ctype, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn transcripts_take_every_response_format() {
        let segment = |start, end, text: &str| Segment {
            start,
            end,
            text: text.into(),
            tokens: vec![1, 2],
            avg_logprob: -0.25,
            no_speech_prob: 0.5,
            temperature: 0.0,
        };
        let t = Heard {
            task: Task::Transcribe,
            text: " Hello there. General Kenobi.".into(),
            language: Some("en".into()),
            duration: 3.5,
            segments: vec![
                segment(0.0, 1.5, " Hello there."),
                segment(1.5, 3.25, " General Kenobi."),
            ],
        };
        let (ctype, json) = body(transcript_response("json", &t)).await;
        assert!(ctype.starts_with("application/json"));
        assert_eq!(json, r#"{"text":"Hello there. General Kenobi."}"#);
        let (_, text) = body(transcript_response("text", &t)).await;
        assert_eq!(text, "Hello there. General Kenobi.\n");
        let (_, srt) = body(transcript_response("srt", &t)).await;
        assert!(
            srt.starts_with("1\n00:00:00,000 --> 00:00:01,500\n Hello there.\n\n2\n00:00:01,500 --> 00:00:03,250\n"),
            "{srt}"
        );
        let (ctype, vtt) = body(transcript_response("vtt", &t)).await;
        assert!(
            ctype.starts_with("text/vtt") && vtt.starts_with("WEBVTT\n\n"),
            "{vtt}"
        );
        let (_, verbose) = body(transcript_response("verbose_json", &t)).await;
        let v: Value = serde_json::from_str(&verbose).unwrap_or_default();
        assert_eq!(v["task"], "transcribe");
        assert_eq!(v["duration"], 3.5);
        assert_eq!(v["segments"][1]["start"], 1.5);
        assert_eq!(v["segments"][1]["text"], " General Kenobi.");
        assert_eq!(v["segments"][0]["avg_logprob"], -0.25);
    }
}
