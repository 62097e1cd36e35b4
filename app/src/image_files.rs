//! Generated images on disk: PNG files carrying their generation parameters in a `parameters`
//! text chunk (the chunk other Stable Diffusion tools read and write), and start images for
//! image-to-image.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use anyhow::{Context, Result, bail};
use backpack_engine::models::diffusion::{ImageParams, SchedulerKind};

/// The `parameters` text: the prompt, the negative prompt, then the settings, in the form
/// other tools parse.
pub fn parameters_text(params: &ImageParams, model: &str) -> String {
    let mut text = params.prompt.clone();
    if !params.negative.is_empty() {
        text.push_str(&format!("\nNegative prompt: {}", params.negative));
    }
    text.push_str(&format!(
        "\nSteps: {}, Sampler: {}, CFG scale: {}, Seed: {}, Size: {}x{}, Model: {}",
        params.steps,
        sampler_name(params.scheduler),
        params.guidance,
        params.seed,
        params.width,
        params.height,
        model
    ));
    if let Some((_, strength)) = &params.init_image {
        text.push_str(&format!(", Denoising strength: {strength}"));
    }
    text
}

/// The sampler names other tools use for the schedulers.
pub fn sampler_name(kind: SchedulerKind) -> &'static str {
    match kind {
        SchedulerKind::Euler => "Euler",
        SchedulerKind::EulerAncestral => "Euler a",
        SchedulerKind::DpmPp2mKarras => "DPM++ 2M Karras",
        SchedulerKind::Lcm => "LCM",
    }
}

/// Settings read back from a `parameters` text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedParameters {
    pub prompt: String,
    pub negative: String,
    pub steps: Option<u32>,
    pub guidance: Option<f32>,
    pub seed: Option<u64>,
    pub size: Option<(u32, u32)>,
    pub scheduler: Option<SchedulerKind>,
    pub model: Option<String>,
}

pub fn parse_parameters(text: &str) -> ParsedParameters {
    let mut out = ParsedParameters::default();
    let mut lines: Vec<&str> = text.lines().collect();
    let settings = match lines.last() {
        Some(l) if l.starts_with("Steps: ") => lines.pop().unwrap_or_default(),
        _ => "",
    };
    let mut prompt = Vec::new();
    let mut negative = Vec::new();
    let mut in_negative = false;
    for line in lines {
        if let Some(rest) = line.strip_prefix("Negative prompt: ") {
            in_negative = true;
            negative.push(rest);
        } else if in_negative {
            negative.push(line);
        } else {
            prompt.push(line);
        }
    }
    out.prompt = prompt.join("\n");
    out.negative = negative.join("\n");
    for field in settings.split(", ") {
        let Some((key, value)) = field.split_once(": ") else {
            continue;
        };
        match key {
            "Steps" => out.steps = value.parse().ok(),
            "CFG scale" => out.guidance = value.parse().ok(),
            "Seed" => out.seed = value.parse().ok(),
            "Size" => {
                out.size = value
                    .split_once('x')
                    .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
            }
            "Sampler" => {
                out.scheduler = [
                    SchedulerKind::Euler,
                    SchedulerKind::EulerAncestral,
                    SchedulerKind::DpmPp2mKarras,
                    SchedulerKind::Lcm,
                ]
                .into_iter()
                .find(|k| sampler_name(*k) == value)
            }
            "Model" => out.model = Some(value.to_owned()),
            _ => {}
        }
    }
    out
}

/// Writes `rgb` (`[height][width][3]`) as an 8-bit PNG with a `parameters` chunk, through a
/// temporary file so an interrupted write never leaves a broken image behind.
pub fn write_png(path: &Path, width: u32, height: u32, rgb: &[u8], parameters: &str) -> Result<()> {
    let tmp = path.with_extension("png.part");
    {
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        encode_png(BufWriter::new(file), width, height, rgb, parameters)?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// `rgb` as PNG bytes with a `parameters` chunk (what the server sends as `b64_json`).
pub fn png_bytes(width: u32, height: u32, rgb: &[u8], parameters: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_png(&mut out, width, height, rgb, parameters)?;
    Ok(out)
}

fn encode_png(
    out: impl std::io::Write,
    width: u32,
    height: u32,
    rgb: &[u8],
    parameters: &str,
) -> Result<()> {
    let mut encoder = png::Encoder::new(out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .add_itxt_chunk("parameters".into(), parameters.into())
        .context("adding the parameters chunk")?;
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(())
}

/// An image's pixels as RGB bytes, with its `parameters` text when it has one (PNGs this or
/// another Stable Diffusion tool wrote).
pub struct DecodedImage {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<u8>,
    pub parameters: Option<String>,
}

/// The most bytes a decoded image may take (a 8192² RGBA image is 256 MiB).
const MAX_DECODED_BYTES: usize = 256 << 20;

pub fn read_png(path: &Path) -> Result<DecodedImage> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // The header's size is the file's word: bound what it may make us allocate.
    let limits = png::Limits {
        bytes: MAX_DECODED_BYTES,
    };
    let mut decoder = png::Decoder::new_with_limits(BufReader::new(file), limits);
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder
        .read_info()
        .with_context(|| format!("{}: not a readable PNG", path.display()))?;
    let size = reader
        .output_buffer_size()
        .context("the PNG is too large")?;
    let mut buf = vec![0; size];
    let frame = reader
        .next_frame(&mut buf)
        .with_context(|| format!("{}: corrupt PNG data", path.display()))?;
    let (width, height) = (frame.width, frame.height);
    let pixels = (width * height) as usize;
    let rgb = match frame.color_type {
        png::ColorType::Rgb => buf[..pixels * 3].to_vec(),
        png::ColorType::Rgba => buf[..pixels * 4]
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        png::ColorType::Grayscale => buf[..pixels].iter().flat_map(|&g| [g, g, g]).collect(),
        png::ColorType::GrayscaleAlpha => buf[..pixels * 2]
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0]])
            .collect(),
        other => bail!("{}: unsupported PNG color type {other:?}", path.display()),
    };
    let info = reader.info();
    let parameters = info
        .utf8_text
        .iter()
        .find(|c| c.keyword == "parameters")
        .and_then(|c| c.get_text().ok())
        .or_else(|| {
            info.uncompressed_latin1_text
                .iter()
                .find(|c| c.keyword == "parameters")
                .map(|c| c.text.clone())
        });
    Ok(DecodedImage {
        width,
        height,
        rgb,
        parameters,
    })
}

/// Whether `path` names a picture [`read_start_image`] reads (by its extension).
pub fn is_start_image(path: &Path) -> bool {
    path.extension().is_some_and(|e| {
        ["png", "jpg", "jpeg", "webp"]
            .iter()
            .any(|x| e.eq_ignore_ascii_case(x))
    })
}

/// A start image for image-to-image: a PNG (with its parameters), a JPEG or a WebP, as people
/// drop photos as well as generated images.
pub fn read_start_image(path: &Path) -> Result<DecodedImage> {
    let is_png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if is_png {
        return read_png(path);
    }
    let mut reader = image::ImageReader::open(path)
        .with_context(|| format!("opening {}", path.display()))?
        .with_guessed_format()
        .with_context(|| format!("reading {}", path.display()))?;
    if reader.format().is_none() {
        bail!("{}: not a PNG, JPEG or WebP image", path.display());
    }
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_DECODED_BYTES as u64);
    reader.limits(limits);
    let decoded = reader
        .decode()
        .with_context(|| format!("{}: not a readable image", path.display()))?
        .to_rgb8();
    Ok(DecodedImage {
        width: decoded.width(),
        height: decoded.height(),
        rgb: decoded.into_raw(),
        parameters: None,
    })
}

/// A start image for image-to-image: resized (nearest) to `width`×`height`, as 0..1 floats.
pub fn init_image_floats(image: &DecodedImage, width: u32, height: u32) -> Vec<f32> {
    let mut out = Vec::with_capacity((width * height * 3) as usize);
    for y in 0..height {
        let sy = (u64::from(y) * u64::from(image.height) / u64::from(height.max(1))) as u32;
        for x in 0..width {
            let sx = (u64::from(x) * u64::from(image.width) / u64::from(width.max(1))) as u32;
            let i = ((sy * image.width + sx) * 3) as usize;
            out.extend(image.rgb[i..i + 3].iter().map(|&v| f32::from(v) / 255.0));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/images")
            .join(name)
    }

    fn expected() -> (u32, u32, Vec<u8>) {
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture("start.json")).expect("pixels"))
                .expect("json");
        let rgb = json["rgb"]
            .as_array()
            .expect("rgb")
            .iter()
            .map(|v| v.as_u64().expect("byte") as u8)
            .collect();
        let size = |k: &str| json[k].as_u64().expect("size") as u32;
        (size("width"), size("height"), rgb)
    }

    /// Photos arrive as JPEG and WebP (written by libjpeg and libwebp through Pillow).
    #[test]
    fn start_images_read_jpeg_and_webp() {
        let (width, height, rgb) = expected();
        let webp = read_start_image(&fixture("start.webp")).expect("webp");
        assert_eq!((webp.width, webp.height), (width, height));
        assert_eq!(webp.rgb, rgb, "lossless WebP keeps every pixel");
        let jpeg = read_start_image(&fixture("start.jpg")).expect("jpeg");
        assert_eq!((jpeg.width, jpeg.height), (width, height));
        let worst = jpeg
            .rgb
            .iter()
            .zip(&rgb)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(0);
        assert!(worst < 48, "JPEG pixels within its loss: {worst}");
        assert!(is_start_image(&fixture("start.jpg")) && !is_start_image(Path::new("a.gif")));
    }

    #[test]
    fn unreadable_start_images_name_the_file() {
        let dir = std::env::temp_dir().join(format!("backpack-start-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("broken.jpg");
        std::fs::write(&path, b"\xFF\xD8\xFF\xE0 not really a jpeg").expect("write");
        let message = format!("{:#}", read_start_image(&path).err().expect("refused"));
        assert!(message.contains("broken.jpg"), "{message}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
