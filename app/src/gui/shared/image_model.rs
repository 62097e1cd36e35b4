//! The image model the panels share: what is loaded, and how loading starts and ends.

use std::path::Path;

use backpack_engine::models::diffusion::{ImageModelInfo, ImageModelOptions, preview_decoder_repo};

use super::Shared;
use crate::gui::common::display_name;
use crate::gui::services::image::{ImageModelState, is_image_model};

impl Shared {
    pub fn image_info(&self) -> Option<&ImageModelInfo> {
        match &self.image_model {
            ImageModelState::Ready { info, .. } => Some(info),
            _ => None,
        }
    }

    /// The image model loaded or loading.
    pub fn image_model_path(&self) -> Option<&Path> {
        match &self.image_model {
            ImageModelState::Ready { path, .. } | ImageModelState::Loading(path) => Some(path),
            ImageModelState::None => None,
        }
    }

    /// Starts loading the image model at `path`; a generation running is stopped.
    pub fn load_image_model(&mut self, path: &Path) {
        self.image_error = None;
        if self.image.is_none() {
            self.image_error = self.engine_error.clone();
            return;
        }
        if !path.exists() {
            self.image_error = Some(format!("{} does not exist", path.display()));
            return;
        }
        if !is_image_model(path) {
            self.image_error = Some(format!(
                "{} is not an image model: choose a diffusers folder (with model_index.json) or a .safetensors checkpoint",
                path.display()
            ));
            return;
        }
        // Full-size previews when the tiny autoencoder of the pipeline's latents is installed.
        let taesd = preview_decoder_repo(path);
        let preview_decoder = self.downloads.as_mut().and_then(|d| {
            d.installed()
                .iter()
                .find(|m| m.repo == taesd)
                .map(|m| m.model_path())
        });
        let options = ImageModelOptions {
            preview_decoder,
            ..Default::default()
        };
        let Some(image) = &self.image else {
            return;
        };
        image.cancel_all();
        image.handle.load(path.to_owned(), options);
        self.image_model = ImageModelState::Loading(path.to_owned());
    }

    pub fn unload_image_model(&mut self) {
        if let Some(image) = &self.image {
            image.cancel_all();
            image.handle.unload();
        }
        self.image_model = ImageModelState::None;
    }

    /// The service finished loading: the model is ready and remembered.
    pub fn image_loaded(&mut self, info: ImageModelInfo) {
        let path = self.image_model_path().map(Path::to_owned);
        let path = path.unwrap_or_else(|| info.path.clone());
        let settings = &mut self.store.state.image;
        settings.remember_model(&path);
        settings.adopt_defaults(&path, &info.defaults);
        self.store.mark_dirty();
        self.image_model = ImageModelState::Ready { path, info };
        self.image_error = None;
    }

    pub fn image_failed(&mut self, message: String) {
        self.image_model = ImageModelState::None;
        self.image_error = Some(message);
    }

    /// Why nothing can be generated yet.
    pub fn image_not_ready(&self) -> String {
        match &self.image_model {
            ImageModelState::Loading(path) => format!("{} is still loading", display_name(path)),
            _ if self.image.is_none() => self
                .engine_error
                .clone()
                .unwrap_or_else(|| "the image service is not running".into()),
            _ => "Load an image model first".into(),
        }
    }
}
