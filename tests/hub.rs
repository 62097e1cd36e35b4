//! Downloads against a local stand-in for the hub (tests/support/fake_hub.rs), with faults:
//! a dropped connection resumes and ends verified, a stall is retried, corruption is detected
//! and re-fetched (or reported), nothing gets a final name before it is verified, pause keeps
//! partial files and resumes from them, cancel leaves nothing, gated repos need a token.

#[path = "support/fake_hub.rs"]
mod fake_hub;

use std::path::{Path, PathBuf};
use std::time::Duration;

use backpack_engine::hub::{
    Catalog, DownloadControl, DownloadEvent, DownloadPlan, HubClient, HubError, Library,
    partial_dir, quant_variants,
};
use fake_hub::{FakeFile, FakeHub, FakeRepo, Fault, bytes};

const WEIGHTS: usize = 3 << 20;

fn repos() -> Vec<FakeRepo> {
    vec![
        FakeRepo {
            id: "tiny/chat-GGUF".into(),
            commit: "c0ffee0000000000000000000000000000000001".into(),
            gated: false,
            files: vec![
                FakeFile::new("chat-Q4_K_M.gguf", bytes(WEIGHTS, 1), true),
                FakeFile::new("chat-Q8_0.gguf", bytes(WEIGHTS * 2, 2), true),
                FakeFile::new("README.md", b"# tiny chat\n".to_vec(), false),
            ],
        },
        FakeRepo {
            id: "gated/model".into(),
            commit: "bead000000000000000000000000000000000002".into(),
            gated: true,
            files: vec![FakeFile::new("config.json", b"{}".to_vec(), false)],
        },
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("backpack-hub-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn client(hub: &FakeHub) -> HubClient {
    HubClient::with_read_timeout(Some(hub.url.clone()), None, Duration::from_millis(800))
        .expect("client")
}

async fn plan_for(
    client: &HubClient,
    library: &Library,
    repo: &str,
    files: &[&str],
) -> DownloadPlan {
    let listing = client.listing(repo, "main").await.expect("listing");
    DownloadPlan {
        repo: repo.into(),
        revision: "main".into(),
        commit: listing.commit.clone(),
        files: listing
            .files
            .iter()
            .filter(|f| files.contains(&f.path.as_str()))
            .cloned()
            .collect(),
        dest: library.dir_for(repo).expect("dir"),
    }
}

fn leftovers(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(
                    e.path()
                        .strip_prefix(root)
                        .expect("inside")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    out.sort();
    out
}

#[test]
fn listing_search_and_quant_variants() {
    let hub = FakeHub::start(repos());
    let client = client(&hub);
    runtime().block_on(async {
        let listing = client
            .listing("tiny/chat-GGUF", "main")
            .await
            .expect("listing");
        assert_eq!(listing.commit, "c0ffee0000000000000000000000000000000001");
        assert_eq!(listing.files.len(), 3);
        let q4 = listing.file("chat-Q4_K_M.gguf").expect("q4");
        assert_eq!(q4.size, WEIGHTS as u64);
        assert_eq!(
            q4.sha256.as_deref(),
            Some(fake_hub::sha256_hex(&bytes(WEIGHTS, 1)).as_str())
        );
        let readme = listing.file("README.md").expect("readme");
        assert!(readme.sha256.is_none() && readme.git_oid.is_some());
        let variants = quant_variants(&listing.files);
        let labels: Vec<&str> = variants.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["Q4_K_M", "Q8_0"]);

        let found = client.search("chat", 10).await.expect("search");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].id, "tiny/chat-GGUF");
        assert!(!found[0].gated);

        let missing = client
            .listing("nobody/nothing", "main")
            .await
            .expect_err("404");
        assert!(matches!(missing, HubError::NotFound { .. }), "{missing}");
    });
}

/// Listings of large repos arrive in pages linked by `Link: <…>; rel="next"`, with folders as
/// entries of their own; a revision the repo lacks is named in the error.
#[test]
fn paged_listings_with_folders_are_followed_to_the_end() {
    let mut repo = repos().remove(0);
    repo.files.extend([
        FakeFile::new("tokenizer/vocab.json", b"{}".to_vec(), false),
        FakeFile::new(
            "unet/diffusion_pytorch_model.safetensors",
            bytes(1000, 9),
            true,
        ),
    ]);
    let hub = FakeHub::start(vec![repo]);
    hub.paginate(2);
    let client = client(&hub);
    runtime().block_on(async {
        let listing = client
            .listing("tiny/chat-GGUF", "main")
            .await
            .expect("listing");
        let paths: Vec<&str> = listing.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "README.md",
                "chat-Q4_K_M.gguf",
                "chat-Q8_0.gguf",
                "tokenizer/vocab.json",
                "unet/diffusion_pytorch_model.safetensors"
            ]
        );
        let pages = hub.log().iter().filter(|l| l.contains("/tree/")).count();
        assert_eq!(pages, 4, "7 entries, 2 a page: {:?}", hub.log());
        let err = client
            .listing("tiny/chat-GGUF", "no-such-branch")
            .await
            .expect_err("unknown revision");
        assert!(matches!(err, HubError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("no-such-branch"), "{err}");
    });
}

#[test]
fn dropped_connection_resumes_and_ends_verified() {
    let hub = FakeHub::start(repos());
    hub.fault(Fault::Drop {
        file: "chat-Q4_K_M.gguf".into(),
        after: WEIGHTS / 3,
        times: 2,
    });
    let root = fresh("drop");
    let library = Library::new(&root);
    let client = client(&hub);
    runtime().block_on(async {
        let plan = plan_for(
            &client,
            &library,
            "tiny/chat-GGUF",
            &["chat-Q4_K_M.gguf", "README.md"],
        )
        .await;
        let final_path = plan.dest.join("chat-Q4_K_M.gguf");
        let mut retries = 0;
        let mut progress = 0;
        let dir =
            backpack_engine::hub::download(&client, &plan, &DownloadControl::default(), |e| {
                match e {
                    DownloadEvent::Retrying { .. } => retries += 1,
                    DownloadEvent::Progress(p) => {
                        progress += 1;
                        assert!(p.done <= p.total && p.file_done <= p.file_total);
                    }
                    DownloadEvent::Verified { .. } => {}
                }
                // Nothing has its final name until every file is verified.
                assert!(!final_path.exists(), "a file got its final name early");
            })
            .await
            .expect("download survives dropped connections");
        assert_eq!(retries, 2);
        assert!(progress > 0);
        assert_eq!(
            std::fs::read(dir.join("chat-Q4_K_M.gguf")).expect("file"),
            bytes(WEIGHTS, 1)
        );
        assert_eq!(
            std::fs::read(dir.join("README.md")).expect("readme"),
            b"# tiny chat\n"
        );
    });
    // The retries asked for the rest of the file, not the whole file again.
    let resumed: Vec<String> = hub
        .log()
        .into_iter()
        .filter(|l| l.contains("resolve") && l.contains("bytes="))
        .collect();
    assert_eq!(resumed.len(), 2, "{resumed:?}");
    assert!(
        resumed.iter().all(|l| !l.ends_with("bytes=0-")),
        "{resumed:?}"
    );
    let installed = library.list();
    assert_eq!(installed.len(), 1);
    assert_eq!(installed[0].repo, "tiny/chat-GGUF");
    assert_eq!(installed[0].manifest.files.len(), 2);
    assert!(installed[0].size >= WEIGHTS as u64);
    assert_eq!(
        leftovers(&root),
        [
            "tiny/chat-GGUF/.backpack-manifest.json",
            "tiny/chat-GGUF/README.md",
            "tiny/chat-GGUF/chat-Q4_K_M.gguf"
        ]
    );
    assert!(library.remove("tiny/chat-GGUF").expect("rm"));
    assert!(library.list().is_empty());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_stall_is_retried_and_resumed() {
    let hub = FakeHub::start(repos());
    hub.fault(Fault::Stall {
        file: "chat-Q4_K_M.gguf".into(),
        after: WEIGHTS / 2,
        pause: Duration::from_secs(3),
        times: 1,
    });
    let root = fresh("stall");
    let library = Library::new(&root);
    let client = client(&hub);
    runtime().block_on(async {
        let plan = plan_for(&client, &library, "tiny/chat-GGUF", &["chat-Q4_K_M.gguf"]).await;
        let mut reasons = Vec::new();
        backpack_engine::hub::download(&client, &plan, &DownloadControl::default(), |e| {
            if let DownloadEvent::Retrying { reason, .. } = e {
                reasons.push(reason);
            }
        })
        .await
        .expect("download survives a stall");
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].contains("stopped responding"), "{reasons:?}");
    });
    assert!(
        hub.log()
            .iter()
            .any(|l| l.ends_with(&format!("bytes={}-", WEIGHTS / 2)))
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn corruption_is_refetched_once_then_reported() {
    let hub = FakeHub::start(repos());
    hub.fault(Fault::Corrupt {
        file: "chat-Q4_K_M.gguf".into(),
        offset: 12345,
        times: 1,
    });
    let root = fresh("corrupt");
    let library = Library::new(&root);
    let client = client(&hub);
    let rt = runtime();
    rt.block_on(async {
        let plan = plan_for(&client, &library, "tiny/chat-GGUF", &["chat-Q4_K_M.gguf"]).await;
        let mut reasons = Vec::new();
        let dir =
            backpack_engine::hub::download(&client, &plan, &DownloadControl::default(), |e| {
                if let DownloadEvent::Retrying { reason, .. } = e {
                    reasons.push(reason);
                }
            })
            .await
            .expect("a corrupted transfer is fetched again");
        assert!(reasons.iter().any(|r| r.contains("SHA-256")), "{reasons:?}");
        assert_eq!(
            std::fs::read(dir.join("chat-Q4_K_M.gguf")).expect("file"),
            bytes(WEIGHTS, 1)
        );
    });
    // A server that keeps serving corrupt bytes: reported, and no file under its final name.
    hub.fault(Fault::Corrupt {
        file: "chat-Q8_0.gguf".into(),
        offset: 7,
        times: 100,
    });
    rt.block_on(async {
        let plan = plan_for(&client, &library, "tiny/chat-GGUF", &["chat-Q8_0.gguf"]).await;
        let err =
            backpack_engine::hub::download(&client, &plan, &DownloadControl::default(), |_| {})
                .await
                .expect_err("corruption is reported");
        assert!(matches!(err, HubError::Checksum { .. }), "{err}");
        assert!(
            err.to_string().contains("chat-Q8_0.gguf is corrupt"),
            "{err}"
        );
        assert!(!plan.dest.join("chat-Q8_0.gguf").exists());
    });
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn pause_keeps_partial_files_and_resume_continues() {
    let hub = FakeHub::start(repos());
    hub.fault(Fault::Slow {
        file: "chat-Q8_0.gguf".into(),
        chunk: 256 << 10,
        every: Duration::from_millis(20),
    });
    let root = fresh("pause");
    let library = Library::new(&root);
    let client = client(&hub);
    runtime().block_on(async {
        let plan = plan_for(&client, &library, "tiny/chat-GGUF", &["chat-Q8_0.gguf"]).await;
        let control = DownloadControl::default();
        let err = backpack_engine::hub::download(&client, &plan, &control, |e| {
            if let DownloadEvent::Progress(p) = e
                && p.file_done > (WEIGHTS as u64)
            {
                control.pause();
            }
        })
        .await
        .expect_err("paused");
        assert!(matches!(err, HubError::Paused), "{err}");
        assert!(!plan.dest.join("chat-Q8_0.gguf").exists());
        let partial = leftovers(&partial_dir(&plan.dest));
        assert!(partial.iter().any(|p| p.ends_with(".part")), "{partial:?}");

        control.resume();
        hub.clear_faults();
        backpack_engine::hub::download(&client, &plan, &control, |_| {})
            .await
            .expect("resumed");
        assert_eq!(
            std::fs::read(plan.dest.join("chat-Q8_0.gguf")).expect("file"),
            bytes(WEIGHTS * 2, 2)
        );
        assert!(!partial_dir(&plan.dest).exists());
    });
    let ranged: Vec<String> = hub
        .log()
        .into_iter()
        .filter(|l| l.contains("bytes="))
        .collect();
    assert_eq!(
        ranged.len(),
        1,
        "the resumed transfer continues: {ranged:?}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn cancel_leaves_nothing_behind() {
    let hub = FakeHub::start(repos());
    hub.fault(Fault::Slow {
        file: "chat-Q8_0.gguf".into(),
        chunk: 256 << 10,
        every: Duration::from_millis(20),
    });
    let root = fresh("cancel");
    let library = Library::new(&root);
    let client = client(&hub);
    runtime().block_on(async {
        let plan = plan_for(
            &client,
            &library,
            "tiny/chat-GGUF",
            &["README.md", "chat-Q8_0.gguf"],
        )
        .await;
        let control = DownloadControl::default();
        let err = backpack_engine::hub::download(&client, &plan, &control, |e| {
            if let DownloadEvent::Progress(p) = e
                && p.file == "chat-Q8_0.gguf"
                && p.file_done > 0
            {
                control.cancel();
            }
        })
        .await
        .expect_err("cancelled");
        assert!(matches!(err, HubError::Cancelled), "{err}");
    });
    assert_eq!(leftovers(&root), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn missing_files_and_gated_repos_are_clear_errors() {
    let hub = FakeHub::start(repos());
    let root = fresh("errors");
    let library = Library::new(&root);
    let rt = runtime();
    let anonymous = client(&hub);
    hub.require_token("hf_secret");
    rt.block_on(async {
        let err = anonymous
            .listing("gated/model", "main")
            .await
            .expect_err("gated");
        assert!(matches!(err, HubError::Gated { .. }), "{err}");
        assert!(err.to_string().contains("HF_TOKEN"), "{err}");

        let authorized = HubClient::with_read_timeout(
            Some(hub.url.clone()),
            Some("hf_secret".into()),
            Duration::from_secs(5),
        )
        .expect("client");
        let plan = plan_for(&authorized, &library, "gated/model", &["config.json"]).await;
        backpack_engine::hub::download(&authorized, &plan, &DownloadControl::default(), |_| {})
            .await
            .expect("a token opens gated repos");

        hub.fault(Fault::Missing {
            file: "README.md".into(),
        });
        let plan = plan_for(&anonymous, &library, "tiny/chat-GGUF", &["README.md"]).await;
        let err =
            backpack_engine::hub::download(&anonymous, &plan, &DownloadControl::default(), |_| {})
                .await
                .expect_err("404");
        assert!(matches!(err, HubError::NotFound { .. }), "{err}");
        assert!(!plan.dest.join("README.md").exists());
    });
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn catalog_variants_select_their_files() {
    let catalog = Catalog::builtin();
    let qwen = catalog.entry("qwen2.5-0.5b-instruct").expect("qwen");
    let listing = backpack_engine::hub::RepoListing {
        repo: "Qwen/Qwen2.5-0.5B-Instruct-GGUF".into(),
        commit: "x".into(),
        gated: false,
        files: [
            "qwen2.5-0.5b-instruct-q4_k_m.gguf",
            "qwen2.5-0.5b-instruct-q8_0.gguf",
            "README.md",
        ]
        .iter()
        .map(|p| backpack_engine::hub::RepoFile {
            path: (*p).into(),
            size: 100,
            sha256: None,
            git_oid: None,
        })
        .collect(),
    };
    let q4 = qwen
        .variants
        .iter()
        .find(|v| v.label.starts_with("Q4_K_M"))
        .expect("variant");
    let picked = q4.select(&listing);
    assert_eq!(picked.len(), 1);
    assert_eq!(picked[0].path, "qwen2.5-0.5b-instruct-q4_k_m.gguf");
}
