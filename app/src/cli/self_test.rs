//! `backpack --self-test`: a readable report a user or support can run without a window: the
//! GPU adapter and what it offers, a few kernels checked against CPU references, and the audio
//! input devices. Exits non-zero when there is no usable GPU or a kernel disagrees.

use anyhow::{Result, bail};
use cpal::traits::{DeviceTrait, HostTrait};

fn audio_inputs() -> Result<Vec<String>, String> {
    let host = cpal::default_host();
    let devices = host.input_devices().map_err(|e| e.to_string())?;
    Ok(devices
        .map(|d| {
            d.description()
                .map(|desc| desc.name().to_owned())
                .unwrap_or_else(|e| format!("(unnamed device: {e})"))
        })
        .collect())
}

pub fn run(adapter: Option<&str>) -> Result<()> {
    println!("Backpack {} self-test", env!("CARGO_PKG_VERSION"));
    let gpu = match backpack_engine::gpu::Gpu::headless(adapter) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("GPU          FAIL: {e}");
            bail!("no usable GPU adapter");
        }
    };
    let info = gpu.info();
    let caps = gpu.caps();
    println!(
        "GPU          {} ({:?}, {:?})",
        info.name, info.backend, info.device_type
    );
    println!("driver       {} {}", info.driver, info.driver_info);
    println!(
        "features     f16 {}, subgroups {} (size {}-{}), timestamps {}",
        yes(caps.shader_f16),
        yes(caps.subgroups),
        caps.subgroup_min_size,
        caps.subgroup_max_size,
        yes(caps.timestamps)
    );
    println!(
        "limits       buffer {}, binding {}, workgroup memory {} KiB",
        backpack_app::gui::format_bytes(caps.max_buffer),
        backpack_app::gui::format_bytes(caps.max_storage_binding),
        caps.max_workgroup_storage / 1024
    );
    if gpu.is_software() {
        println!("note         this is a CPU (software) adapter: models will run slowly");
    }
    let checks = backpack_engine::selftest::run(&gpu)?;
    let mut failed = 0;
    for c in &checks {
        println!(
            "kernel       {} {}: {}",
            if c.passed { "ok  " } else { "FAIL" },
            c.name,
            c.detail
        );
        failed += usize::from(!c.passed);
    }
    match audio_inputs() {
        Ok(names) if names.is_empty() => println!("audio input  none found"),
        Ok(names) => {
            for n in names {
                println!("audio input  {n}");
            }
        }
        Err(e) => println!("audio input  unavailable ({e})"),
    }
    if failed > 0 {
        bail!(
            "{failed} of {} kernel checks failed on {}",
            checks.len(),
            info.name
        );
    }
    println!("all good");
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
