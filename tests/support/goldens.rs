//! A tiny pipeline's goldens: `tests/fixtures/goldens/NAME.json` (what each golden is, the
//! cases) and `NAME.safetensors` (the tensors), as the generator scripts write them.

use std::path::{Path, PathBuf};

use backpack_engine::load::SafeTensors;
use serde_json::Value;

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub struct Goldens(pub &'static str);

impl Goldens {
    pub fn meta(&self) -> Value {
        let path = root().join(format!("tests/fixtures/goldens/{}.json", self.0));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", self.0));
        serde_json::from_str(&text).expect("json")
    }

    pub fn get(&self, name: &str) -> Vec<f32> {
        let path = root().join(format!("tests/fixtures/goldens/{}.safetensors", self.0));
        let st = SafeTensors::open_files(&[path]).expect("goldens");
        st.get(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .to_f32()
    }
}
