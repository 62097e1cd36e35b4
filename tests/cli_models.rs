//! `backpack models …` end to end against a local stand-in for the hub: a download survives a
//! dropped connection and is verified, the installed model runs by repo id, a model too big for
//! the GPU is refused with the numbers and a smaller variant is named, and `rm` removes it.

#[path = "support/fake_hub.rs"]
mod fake_hub;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fake_hub::{FakeFile, FakeHub, FakeRepo, Fault};

fn fixture_gguf() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models/tiny-llama-spm.gguf");
    std::fs::read(path).expect("fixture")
}

fn backpack(hub: &FakeHub, dir: &Path, args: &[&str]) -> Output {
    command(hub, dir, args).output().expect("the binary runs")
}

/// `backpack ARGS` against `hub`, with its data and models under `dir`.
fn command(hub: &FakeHub, dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_backpack"));
    command
        .args(args)
        .env("HF_ENDPOINT", &hub.url)
        .env_remove("HF_TOKEN")
        .env("BACKPACK_DATA_DIR", dir.join("data"))
        .env("BACKPACK_MODELS_DIR", dir.join("models"))
        // The fit check runs against the software adapter CI has, whatever else is present.
        .env("BACKPACK_ADAPTER", "llvmpipe");
    command
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn hub() -> FakeHub {
    let gguf = fixture_gguf();
    let mut f16 = FakeFile::new("huge-F16.gguf", vec![0; 16], true);
    f16.listed_size = Some(600 << 20);
    let mut q4 = FakeFile::new("huge-Q4_K_M.gguf", vec![0; 16], true);
    q4.listed_size = Some(100 << 20);
    FakeHub::start(vec![
        FakeRepo {
            id: "tiny/spm-GGUF".into(),
            commit: "5eed000000000000000000000000000000000003".into(),
            gated: false,
            files: vec![
                FakeFile::new("tiny-spm-Q8_0.gguf", gguf, true),
                FakeFile::new("README.md", b"tiny\n".to_vec(), false),
            ],
        },
        FakeRepo {
            id: "huge/model-GGUF".into(),
            commit: "b16b000000000000000000000000000000000004".into(),
            gated: false,
            files: vec![
                // A shape whose f16 token embedding (200k x 1024) outgrows a 128 MiB binding.
                FakeFile::new(
                    "config.json",
                    br#"{"hidden_size": 1024, "num_hidden_layers": 2, "vocab_size": 200000,
                        "num_attention_heads": 16, "intermediate_size": 4096}"#
                        .to_vec(),
                    false,
                ),
                f16,
                q4,
            ],
        },
    ])
}

#[test]
fn models_download_survives_a_dropped_connection_and_runs_by_repo_id() {
    let hub = hub();
    hub.fault(Fault::Drop {
        file: "tiny-spm-Q8_0.gguf".into(),
        after: 60_000,
        times: 1,
    });
    let dir = std::env::temp_dir().join(format!("backpack-cli-models-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let out = backpack(&hub, &dir, &["models", "search", "spm"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("tiny/spm-GGUF"), "{}", text(&out));

    let out = backpack(&hub, &dir, &["models", "download", "tiny/spm-GGUF"]);
    let log = text(&out);
    println!("{log}");
    assert!(out.status.success(), "{log}");
    assert!(log.contains("resuming in"), "the drop was retried: {log}");
    assert!(log.contains("tiny-spm-Q8_0.gguf: verified"), "{log}");
    assert!(log.contains("done: every file verified"), "{log}");
    assert!(
        hub.log().iter().any(|l| l.ends_with("bytes=60000-")),
        "resumed from the partial file: {:?}",
        hub.log()
    );

    let out = backpack(&hub, &dir, &["models", "list"]);
    assert!(text(&out).contains("tiny/spm-GGUF"), "{}", text(&out));

    let out = backpack(
        &hub,
        &dir,
        &[
            "generate",
            "--model",
            "tiny/spm-GGUF",
            "--raw",
            "--prompt",
            "The fox",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));

    let out = backpack(&hub, &dir, &["models", "rm", "tiny/spm-GGUF"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = backpack(&hub, &dir, &["models", "rm", "tiny/spm-GGUF"]);
    assert!(!out.status.success());
    let out = backpack(
        &hub,
        &dir,
        &["generate", "--model", "tiny/spm-GGUF", "--prompt", "x"],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("models download tiny/spm-GGUF"),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn models_too_big_for_the_gpu_are_refused_with_numbers() {
    let hub = hub();
    let dir = std::env::temp_dir().join(format!("backpack-cli-fit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = backpack(
        &hub,
        &dir,
        &["models", "download", "huge/model-GGUF", "--quant", "F16"],
    );
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("does not fit"), "{log}");
    assert!(log.contains("binds at most 128.0 MiB per buffer"), "{log}");
    assert!(
        log.contains("--quant Q4_K_M"),
        "a smaller variant is offered: {log}"
    );
    // Nothing was fetched.
    assert!(
        !hub.log()
            .iter()
            .any(|l| l.contains("/resolve/") && l.contains(".gguf"))
    );
    assert!(!dir.join("models/huge").exists());

    let out = backpack(&hub, &dir, &["models", "download", "huge/model-GGUF"]);
    let log = text(&out);
    assert!(!out.status.success());
    assert!(
        log.contains("several quantizations") && log.contains("F16"),
        "{log}"
    );

    let out = backpack(&hub, &dir, &["models", "download", "nobody/nothing"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("not found"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model another tool downloaded into the Hugging Face cache (huggingface_hub's layout: blobs,
/// a snapshot of links, refs/main) is listed as found and runs by its repo id without a copy;
/// LM Studio's and Ollama's folders are listed too.
#[test]
fn models_already_on_this_machine_are_found_and_used_in_place() {
    let hub = hub();
    let dir = std::env::temp_dir().join(format!("backpack-cli-found-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let home = dir.join("home");
    let repo = home.join(".cache/huggingface/hub/models--tiny--cached-GGUF");
    let gguf = fixture_gguf();
    let blob = repo.join("blobs").join(fake_hub::sha256_hex(&gguf));
    std::fs::create_dir_all(blob.parent().expect("blobs")).expect("mkdir");
    std::fs::write(&blob, &gguf).expect("blob");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snapshot).expect("mkdir");
    let file = snapshot.join("tiny-spm-Q8_0.gguf");
    #[cfg(unix)]
    std::os::unix::fs::symlink(
        format!("../../blobs/{}", fake_hub::sha256_hex(&gguf)),
        &file,
    )
    .expect("link");
    #[cfg(not(unix))]
    std::fs::copy(&blob, &file).expect("copy");
    std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
    std::fs::write(repo.join("refs/main"), "0123abcd").expect("ref");
    let lms = home.join(".lmstudio/models/someone/Tiny-GGUF/tiny-Q8_0.gguf");
    std::fs::create_dir_all(lms.parent().expect("parent")).expect("mkdir");
    std::fs::write(&lms, &gguf).expect("lm studio file");

    let run = |args: &[&str]| {
        command(&hub, &dir, args)
            .env("HOME", &home)
            .env_remove("HF_HOME")
            .env_remove("HF_HUB_CACHE")
            .env_remove("HUGGINGFACE_HUB_CACHE")
            .env_remove("XDG_CACHE_HOME")
            .env_remove("OLLAMA_MODELS")
            .output()
            .expect("the binary runs")
    };
    let out = run(&["models", "list"]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("found on this machine"), "{log}");
    assert!(
        log.contains("tiny/cached-GGUF/tiny-spm-Q8_0.gguf") && log.contains("Hugging Face cache"),
        "{log}"
    );
    assert!(
        log.contains("someone/Tiny-GGUF/tiny-Q8_0.gguf") && log.contains("LM Studio"),
        "{log}"
    );
    let out = run(&[
        "generate",
        "--model",
        "tiny/cached-GGUF",
        "--raw",
        "--prompt",
        "The fox",
        "--max-tokens",
        "2",
        "--temperature",
        "0",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!dir.join("models").exists(), "nothing was copied");
    let _ = file;
    let _ = std::fs::remove_dir_all(&dir);
}
