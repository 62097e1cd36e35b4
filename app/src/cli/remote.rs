//! `generate`, `transcribe` and `image` against a remote OpenAI-compatible endpoint
//! (`--endpoint URL --model NAME`), printing what the local commands print.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use backpack_engine::load::ChatMessage;
use backpack_engine::remote::chat::RemoteInput;
use backpack_engine::remote::media::{RemoteAudio, RemoteImageRequest, RemoteTranscript};
use backpack_engine::remote::{ChatParams, Endpoint, RemoteClient};
use clap::Args;

/// Where a command runs when not on the local GPU.
#[derive(Args, Clone, Debug, Default)]
pub struct RemoteArgs {
    /// Run on an OpenAI-compatible server instead of the local GPU (e.g.
    /// http://127.0.0.1:8000/v1 for vLLM, or another `backpack serve`); --model then names
    /// one of the server's models.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// The endpoint's API key, sent as `Authorization: Bearer` (also OPENAI_API_KEY).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds the endpoint may send nothing before the request is given up.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub timeout: u64,
}

impl RemoteArgs {
    fn client(&self, url: &str) -> Result<RemoteClient> {
        let endpoint = Endpoint::new(url, self.api_key.clone())?
            .with_stall(Duration::from_secs(self.timeout.max(1)));
        Ok(RemoteClient::new(endpoint)?)
    }
}

/// A current-thread runtime: one request, no GPU work to wait on.
fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

/// What `generate` asks a remote model for.
pub struct RemotePrompt<'a> {
    pub model: &'a str,
    pub prompt: &'a str,
    pub system: Option<&'a str>,
    pub raw: bool,
    pub params: ChatParams,
    pub json: bool,
}

/// Streams the answer to stdout as it comes; with `json`, one line of JSON follows (the local
/// command's fields; token ids are empty, since servers send text).
pub fn generate(remote: &RemoteArgs, url: &str, p: RemotePrompt<'_>) -> Result<()> {
    let client = remote.client(url)?;
    let mut messages = Vec::new();
    if let Some(system) = p.system {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", p.prompt));
    let input = if p.raw {
        RemoteInput::Text(p.prompt)
    } else {
        RemoteInput::Chat(&messages)
    };
    let mut stdout = std::io::stdout();
    let mut write_failed = None;
    let answer = block_on(async {
        let mut on_delta = |text: &str| {
            if let Err(e) = stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                write_failed.get_or_insert(e);
            }
        };
        Ok(client
            .stream(p.model, input, &p.params, &|| false, &mut on_delta)
            .await?)
    })
    .with_context(|| format!("generation on {url} failed"))?;
    if let Some(e) = write_failed {
        return Err(e).context("writing the answer");
    }
    writeln!(stdout)?;
    let prompt_tokens = answer.prompt_tokens.unwrap_or(0);
    eprintln!(
        "{url}: {prompt_tokens} prompt tokens, {} generated ({}), time to first token {:.1} ms, {:.1} tokens/s",
        answer.completion_tokens,
        answer
            .finish_reason
            .as_deref()
            .unwrap_or("no finish reason"),
        answer.ttft.as_secs_f64() * 1e3,
        answer.tokens_per_s
    );
    if p.json {
        let line = serde_json::json!({
            "prompt_tokens": [],
            "tokens": [],
            "text": answer.text,
            "ttft_ms": answer.ttft.as_secs_f64() * 1e3,
            "tokens_per_s": answer.tokens_per_s,
            "finish_reason": answer.finish_reason,
            "usage": {
                "prompt_tokens": answer.prompt_tokens,
                "completion_tokens": answer.completion_tokens,
            },
            "endpoint": client.endpoint().base_url,
            "model": p.model,
        });
        writeln!(stdout, "{line}")?;
    }
    Ok(())
}

/// Sends an audio file as it is (the server decodes it); returns the transcript and the
/// seconds it took.
pub fn transcribe(
    remote: &RemoteArgs,
    url: &str,
    model: &str,
    audio: &Path,
    mut request: RemoteAudio,
) -> Result<(RemoteTranscript, f64)> {
    let client = remote.client(url)?;
    request.bytes = std::fs::read(audio).with_context(|| format!("reading {}", audio.display()))?;
    if request.bytes.is_empty() {
        bail!("{} is empty", audio.display());
    }
    request.file_name = audio
        .file_name()
        .map_or_else(|| "audio".into(), |n| n.to_string_lossy().into_owned());
    let began = Instant::now();
    let transcript = block_on(async { Ok(client.transcribe(model, &request).await?) })
        .with_context(|| format!("transcription on {url} failed"))?;
    Ok((transcript, began.elapsed().as_secs_f64()))
}

/// Where an image was written, and its size when known (PNGs).
pub type WrittenImage = (PathBuf, Option<(u32, u32)>);

/// Generates images remotely and writes each where `out_path(index)` says (the extension
/// follows the format the server sent). Returns (path, width, height) for each.
pub fn images(
    remote: &RemoteArgs,
    url: &str,
    model: &str,
    request: &RemoteImageRequest,
    out_path: impl Fn(u32) -> PathBuf,
) -> Result<Vec<WrittenImage>> {
    let client = remote.client(url)?;
    let images = block_on(async { Ok(client.images(model, request).await?) })
        .with_context(|| format!("image generation on {url} failed"))?;
    let mut written = Vec::new();
    for (index, bytes) in (0u32..).zip(images) {
        let (ext, size) = image_kind(&bytes)
            .with_context(|| format!("{url} sent image {} in an unknown format", index + 1))?;
        let out = out_path(index);
        let out = if out.extension().and_then(|e| e.to_str()) == Some(ext) {
            out
        } else {
            out.with_extension(ext)
        };
        let tmp = out.with_extension(format!("{ext}.part"));
        std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &out).with_context(|| format!("writing {}", out.display()))?;
        written.push((out, size));
    }
    Ok(written)
}

/// The file extension for an encoded image, and its size when it is a PNG.
fn image_kind(bytes: &[u8]) -> Option<(&'static str, Option<(u32, u32)>)> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let info = decoder.read_info().ok()?;
        let header = info.info();
        return Some(("png", Some((header.width, header.height))));
    }
    if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        return Some(("jpg", None));
    }
    if bytes.len() > 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return Some(("webp", None));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_kinds_come_from_magic_bytes() {
        let png = backpack_app::image_files::png_bytes(3, 2, &[0; 18], "p").expect("png");
        assert_eq!(image_kind(&png), Some(("png", Some((3, 2)))));
        assert_eq!(image_kind(&[0xff, 0xd8, 0xff, 0xe0]), Some(("jpg", None)));
        assert_eq!(image_kind(b"RIFF\0\0\0\0WEBPVP8 "), Some(("webp", None)));
        assert_eq!(image_kind(b"<html>"), None);
        assert_eq!(image_kind(b"\x89PNG\r\n\x1a\ngarbage"), None);
    }
}
