//! The gallery: every image made, as a PNG file in `<data dir>/images` carrying its
//! parameters. The folder is listed at start (newest first) and its files are read on a
//! background thread, so a large gallery never holds up the window; only thumbnails stay in
//! memory.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use backpack_engine::models::diffusion::Generated;
use eframe::egui;

use super::{Action, ImagePanel};
use crate::image_files::{read_png, write_png};

/// Thumbnails are at most this many pixels on their longer side.
const THUMB_PIXELS: u32 = 128;
/// And drawn this many points wide.
const THUMB_POINTS: f32 = 96.0;

#[derive(Clone, Debug)]
pub struct ItemInfo {
    pub width: u32,
    pub height: u32,
    /// The `parameters` text, when the file has one.
    pub parameters: Option<String>,
}

pub struct GalleryItem {
    pub id: u64,
    pub path: PathBuf,
    /// Size and parameters once the file has been read, or why it could not be.
    pub info: Option<Result<ItemInfo, String>>,
    pub thumb: Option<egui::TextureHandle>,
}

impl GalleryItem {
    /// The prompt, for hover texts.
    fn prompt(&self) -> Option<&str> {
        let info = self.info.as_ref()?.as_ref().ok()?;
        let text = info.parameters.as_deref()?;
        Some(text.lines().next().unwrap_or_default())
    }
}

/// What the reader thread sends: the file, and its size, parameters and thumbnail.
type Read = (PathBuf, Result<(ItemInfo, egui::ColorImage), String>);

pub struct Gallery {
    dir: PathBuf,
    /// Newest first.
    items: Vec<GalleryItem>,
    next_id: u64,
    read: Option<mpsc::Receiver<Read>>,
}

impl Gallery {
    /// Lists `dir` and starts reading its images in the background.
    pub fn open(dir: PathBuf, ctx: &egui::Context) -> Self {
        let paths = list_pngs(&dir);
        let items: Vec<GalleryItem> = paths
            .iter()
            .zip(1..)
            .map(|(path, id)| GalleryItem {
                id,
                path: path.clone(),
                info: None,
                thumb: None,
            })
            .collect();
        let next_id = items.len() as u64 + 1;
        let read = (!paths.is_empty())
            .then(|| read_in_background(paths, ctx.clone()))
            .flatten();
        Self {
            dir,
            items,
            next_id,
            read,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn items(&self) -> &[GalleryItem] {
        &self.items
    }

    pub fn get(&self, id: u64) -> Option<&GalleryItem> {
        self.items.iter().find(|i| i.id == id)
    }

    /// Takes in what the reader thread has read so far.
    pub fn poll(&mut self, ctx: &egui::Context) {
        let Some(rx) = &self.read else { return };
        loop {
            match rx.try_recv() {
                Ok((path, read)) => {
                    let Some(item) = self.items.iter_mut().find(|i| i.path == path) else {
                        continue;
                    };
                    item.info = Some(read.map(|(info, thumb)| {
                        let name = path.display().to_string();
                        item.thumb = Some(ctx.load_texture(name, thumb, Default::default()));
                        info
                    }));
                }
                Err(mpsc::TryRecvError::Empty) => return,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.read = None;
                    return;
                }
            }
        }
    }

    /// Writes `image` as a new PNG with its `parameters` and puts it first; returns its id.
    pub fn add(
        &mut self,
        ctx: &egui::Context,
        image: &Generated,
        seed: u64,
        parameters: &str,
    ) -> Result<u64> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let path = self.free_path(seed);
        write_png(&path, image.width, image.height, &image.rgb, parameters)?;
        let id = self.next_id;
        self.next_id += 1;
        let thumb = thumbnail(&image.rgb, image.width, image.height);
        let name = path.display().to_string();
        self.items.insert(
            0,
            GalleryItem {
                id,
                thumb: Some(ctx.load_texture(name, thumb, Default::default())),
                path,
                info: Some(Ok(ItemInfo {
                    width: image.width,
                    height: image.height,
                    parameters: Some(parameters.to_owned()),
                })),
            },
        );
        Ok(id)
    }

    /// `<UTC date>-<time>-<seed>.png`, with a counter when that name is taken.
    fn free_path(&self, seed: u64) -> PathBuf {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let stem = format!("{}-{seed}", file_stamp(now));
        let mut path = self.dir.join(format!("{stem}.png"));
        let mut n = 2;
        while path.exists() {
            path = self.dir.join(format!("{stem}-{n}.png"));
            n += 1;
        }
        path
    }

    /// Deletes image `id` and its file.
    pub fn remove(&mut self, id: u64) -> Result<()> {
        let Some(item) = self.get(id) else {
            return Ok(());
        };
        match std::fs::remove_file(&item.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {}", item.path.display())),
        }
        self.items.retain(|i| i.id != id);
        Ok(())
    }

    /// The image to select once `id` is gone: the next older one, else the newer one.
    pub fn neighbor(&self, id: u64) -> Option<u64> {
        let at = self.items.iter().position(|i| i.id == id)?;
        let next = self
            .items
            .get(at + 1)
            .or_else(|| at.checked_sub(1).and_then(|i| self.items.get(i)));
        next.map(|i| i.id)
    }
}

/// The PNG files in `dir`, newest first.
fn list_pngs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")))
        .map(|p| {
            let modified = std::fs::metadata(&p).and_then(|m| m.modified());
            (modified.unwrap_or(UNIX_EPOCH), p)
        })
        .collect();
    files.sort_by(|a, b| b.cmp(a));
    files.into_iter().map(|(_, p)| p).collect()
}

/// Reads each file on a thread of its own, waking the UI as they come.
fn read_in_background(paths: Vec<PathBuf>, ctx: egui::Context) -> Option<mpsc::Receiver<Read>> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("image-gallery".into())
        .spawn(move || {
            for path in paths {
                let read = read_png(&path)
                    .map(|png| {
                        let info = ItemInfo {
                            width: png.width,
                            height: png.height,
                            parameters: png.parameters,
                        };
                        (info, thumbnail(&png.rgb, png.width, png.height))
                    })
                    .map_err(|e| format!("{e:#}"));
                if tx.send((path, read)).is_err() {
                    return;
                }
                ctx.request_repaint();
            }
        });
    spawned.ok().map(|_| rx)
}

/// `rgb` (`[height][width][3]`) shrunk to at most [`THUMB_PIXELS`] a side, each pixel the
/// mean of the ones it covers.
pub fn thumbnail(rgb: &[u8], width: u32, height: u32) -> egui::ColorImage {
    let (w, h) = (width.max(1) as usize, height.max(1) as usize);
    let scale = (w.max(h) as f32 / THUMB_PIXELS as f32).max(1.0);
    let tw = ((w as f32 / scale).round() as usize).max(1);
    let th = ((h as f32 / scale).round() as usize).max(1);
    let mut out = Vec::with_capacity(tw * th * 3);
    for ty in 0..th {
        let (y0, y1) = (ty * h / th, ((ty + 1) * h / th).max(ty * h / th + 1));
        for tx in 0..tw {
            let (x0, x1) = (tx * w / tw, ((tx + 1) * w / tw).max(tx * w / tw + 1));
            let mut sum = [0u32; 3];
            for y in y0..y1 {
                for x in x0..x1 {
                    let i = (y * w + x) * 3;
                    for (s, v) in sum.iter_mut().zip(rgb.get(i..i + 3).unwrap_or(&[0; 3])) {
                        *s += u32::from(*v);
                    }
                }
            }
            let n = ((y1 - y0) * (x1 - x0)) as u32;
            out.extend(sum.map(|s| (s / n) as u8));
        }
    }
    egui::ColorImage::from_rgb([tw, th], &out)
}

/// `YYYYMMDD-HHMMSS` in UTC (the app has no time zone database).
fn file_stamp(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rest = unix_secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (hh, mm, ss) = (rest / 3600, rest / 60 % 60, rest % 60);
    format!("{year:04}{month:02}{day:02}-{hh:02}{mm:02}{ss:02}")
}

/// Shows `dir` in the platform's file manager.
pub fn open_folder(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    let mut child = std::process::Command::new(opener).arg(dir).spawn()?;
    // Waited for on the side, so it leaves no zombie behind.
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// The gallery column: a button for the folder, then the thumbnails, newest first.
pub(super) fn show(panel: &ImagePanel, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    ui.add_space(6.0);
    ui.horizontal(|ui| {
        ui.strong("Gallery");
        ui.weak(panel.gallery.items.len().to_string());
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            if ui
                .small_button("Open folder")
                .on_hover_text(panel.gallery.dir.display().to_string())
                .clicked()
            {
                actions.push(Action::OpenFolder);
            }
        });
    });
    ui.add_space(4.0);
    egui::ScrollArea::vertical()
        .auto_shrink(false)
        .show(ui, |ui| {
            if panel.gallery.items.is_empty() {
                ui.weak("Images you make appear here.");
            }
            ui.horizontal_wrapped(|ui| {
                for item in &panel.gallery.items {
                    thumb(ui, item, panel.selected == Some(item.id), actions);
                }
            });
        });
}

fn thumb(ui: &mut egui::Ui, item: &GalleryItem, selected: bool, actions: &mut Vec<Action>) {
    let r = match &item.thumb {
        Some(texture) => {
            let [w, h] = texture.size().map(|v| v as f32);
            let size = egui::vec2(THUMB_POINTS, THUMB_POINTS * h / w.max(1.0));
            let image = egui::Image::new(egui::load::SizedTexture::new(texture.id(), size));
            ui.add(egui::Button::image(image).selected(selected))
        }
        None => {
            let label = match &item.info {
                Some(Err(_)) => "unreadable",
                _ => "…",
            };
            let button = egui::Button::selectable(selected, label)
                .min_size(egui::vec2(THUMB_POINTS, THUMB_POINTS));
            ui.add(button)
        }
    };
    let hover = item.prompt().unwrap_or_default();
    let hover = if hover.is_empty() {
        crate::gui::common::display_name(&item.path)
    } else {
        hover.to_owned()
    };
    let r = r.on_hover_text(hover);
    if r.clicked() {
        actions.push(Action::Select(item.id));
    }
    r.context_menu(|ui| {
        if ui.button("Reuse parameters").clicked() {
            actions.push(Action::Reuse(item.id));
        }
        if ui.button("Delete").clicked() {
            actions.push(Action::Delete(item.id));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbnails_average_and_stamps_read_as_dates() {
        let rgb: Vec<u8> = (0..256 * 256)
            .flat_map(|i| [(i % 2 * 200) as u8, 10, 20])
            .collect();
        let t = thumbnail(&rgb, 256, 256);
        assert_eq!(t.size, [128, 128]);
        assert_eq!(t.pixels[0], egui::Color32::from_rgb(100, 10, 20));
        let small = thumbnail(&[1, 2, 3], 1, 1);
        assert_eq!(small.size, [1, 1]);
        assert_eq!(file_stamp(0), "19700101-000000");
        assert_eq!(file_stamp(1_709_210_096), "20240229-123456");
    }
}
