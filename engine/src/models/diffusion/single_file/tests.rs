use std::io::Read;
use std::path::PathBuf;

use serde_json::json;

use super::*;
use crate::load::{DType, TensorView};
use crate::models::diffusion::config::{ClipConfig, UnetConfig, VaeConfig};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// Names and shapes of real SD 1.5 / 2.1 / XL checkpoints and of the diffusers models they load
/// into (tests/reference/make_sd_checkpoint_layouts.py).
fn real_layouts() -> Value {
    let file = std::fs::File::open(fixtures().join("goldens/sd_checkpoint_layouts.json.gz"))
        .expect("sd_checkpoint_layouts.json.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .expect("gzip");
    serde_json::from_str(&text).expect("json")
}

fn same_tensors(what: &str, got: &Shapes, expected: &Shapes) {
    let missing: Vec<&String> = expected.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
    let wrong: Vec<&String> = expected
        .keys()
        .filter(|k| got.get(*k).is_some_and(|s| s != &expected[*k]))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && wrong.is_empty(),
        "{what}: missing {:?}, extra {:?}, other shapes {:?}",
        &missing[..missing.len().min(5)],
        &extra[..extra.len().min(5)],
        &wrong[..wrong.len().min(5)]
    );
}

/// `got[field]` equals `expected[field]` (or `default` where the released config leaves the
/// field out), a number standing for the same number at every level.
fn agree(what: &str, got: &Value, expected: &Value, fields: &[(&str, Value)]) {
    for (field, default) in fields {
        let want = expected.get(*field).unwrap_or(default);
        let have = &got[*field];
        let matches = match (have, want) {
            (Value::Array(items), Value::Number(_)) => items.iter().all(|i| i == want),
            (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
            _ => have == want,
        };
        assert!(matches, "{what} {field}: inferred {have}, released {want}");
    }
}

fn unet_fields() -> Vec<(&'static str, Value)> {
    [
        "block_out_channels",
        "layers_per_block",
        "cross_attention_dim",
        "in_channels",
        "out_channels",
        "down_block_types",
        "up_block_types",
    ]
    .into_iter()
    .map(|f| (f, Value::Null))
    .chain([
        ("transformer_layers_per_block", json!(1)),
        ("use_linear_projection", json!(false)),
        ("addition_embed_type", Value::Null),
        ("addition_time_embed_dim", Value::Null),
        ("projection_class_embeddings_input_dim", Value::Null),
    ])
    .collect()
}

fn vae_fields() -> Vec<(&'static str, Value)> {
    [
        "block_out_channels",
        "layers_per_block",
        "latent_channels",
        "in_channels",
        "out_channels",
    ]
    .into_iter()
    .map(|f| (f, Value::Null))
    .collect()
}

fn clip_fields() -> Vec<(&'static str, Value)> {
    [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "max_position_embeddings",
        "vocab_size",
        "hidden_act",
    ]
    .into_iter()
    .map(|f| (f, Value::Null))
    .collect()
}

#[test]
fn real_checkpoint_layouts_map_like_diffusers() {
    let layouts = real_layouts();
    for (kind, family) in [
        ("sd15", Family::Sd1),
        ("sd21", Family::Sd2),
        ("sdxl", Family::Sdxl),
    ] {
        let f = &layouts[kind];
        // What SafeTensors::names lists: the integer buffers are not read.
        let shapes: Shapes = f["checkpoint"]
            .as_array()
            .expect("checkpoint")
            .iter()
            .filter(|t| matches!(t[1].as_str(), Some("F16" | "F32" | "BF16")))
            .map(|t| {
                let shape = serde_json::from_value(t[2].clone()).expect("shape");
                (t[0].as_str().expect("name").to_owned(), shape)
            })
            .collect();
        let plan = plan(&shapes).expect(kind);
        assert_eq!(plan.family, family, "{kind}");
        let expected =
            |part: &str| -> Shapes { serde_json::from_value(f[part].clone()).expect(part) };
        let unet = part_shapes(&plan.unet, &shapes);
        let vae = part_shapes(&plan.vae, &shapes);
        let text = part_shapes(&plan.text, &shapes);
        let text_2 = plan.text_2.as_ref().map(|p| part_shapes(p, &shapes));
        same_tensors(&format!("{kind} unet"), &unet, &expected("unet"));
        same_tensors(&format!("{kind} vae"), &vae, &expected("vae"));
        same_tensors(&format!("{kind} text"), &text, &expected("text_encoder"));
        assert_eq!(text_2.is_some(), family == Family::Sdxl);
        if let Some(t) = &text_2 {
            same_tensors(&format!("{kind} text 2"), t, &expected("text_encoder_2"));
        }

        let c = configs::configs(family, &unet, &vae, &text, text_2.as_ref()).expect(kind);
        let mut unet_fields = unet_fields();
        unet_fields.extend([
            ("attention_head_dim", Value::Null),
            ("sample_size", Value::Null),
            ("norm_num_groups", Value::Null),
        ]);
        agree(kind, &c.unet, &f["unet_config"], &unet_fields);
        let mut vae_fields = vae_fields();
        vae_fields.extend([
            ("norm_num_groups", Value::Null),
            ("scaling_factor", Value::Null),
            ("sample_size", Value::Null),
        ]);
        agree(kind, &c.vae, &f["vae_config"], &vae_fields);
        let mut clip_fields = clip_fields();
        clip_fields.push(("num_attention_heads", Value::Null));
        agree(kind, &c.text, &f["text_encoder_config"], &clip_fields);
        if let Some(t) = &c.text_2 {
            clip_fields.push(("projection_dim", Value::Null));
            agree(kind, t, &f["text_encoder_2_config"], &clip_fields);
        }
        // The engine's own config readers accept them.
        UnetConfig::from_json(&c.unet).expect("unet config");
        VaeConfig::from_json(&c.vae).expect("vae config");
        ClipConfig::from_json(&c.text).expect("clip config");
        if let Some(t) = &c.text_2 {
            assert_eq!(
                ClipConfig::from_json(t).expect("clip 2").projection,
                Some(1280)
            );
        }
    }
}

#[test]
fn real_names_spot_checks() {
    let layouts = real_layouts();
    let shapes = |kind: &str| -> Shapes {
        layouts[kind]["checkpoint"]
            .as_array()
            .expect("checkpoint")
            .iter()
            .filter(|t| t[1] != "I64" && t[1] != "I32")
            .map(|t| {
                let shape = serde_json::from_value(t[2].clone()).expect("shape");
                (t[0].as_str().expect("name").to_owned(), shape)
            })
            .collect()
    };
    let unet = |k: &str| whole(&format!("{UNET}{k}"));
    let sd15 = plan(&shapes("sd15")).expect("sd15");
    for (name, ldm) in [
        (
            "down_blocks.1.attentions.1.transformer_blocks.0.attn2.to_k.weight",
            "input_blocks.5.1.transformer_blocks.0.attn2.to_k.weight",
        ),
        (
            "down_blocks.0.downsamplers.0.conv.weight",
            "input_blocks.3.0.op.weight",
        ),
        (
            "up_blocks.0.upsamplers.0.conv.bias",
            "output_blocks.2.1.conv.bias",
        ),
        (
            "up_blocks.1.upsamplers.0.conv.weight",
            "output_blocks.5.2.conv.weight",
        ),
        (
            "up_blocks.3.resnets.2.conv_shortcut.weight",
            "output_blocks.11.0.skip_connection.weight",
        ),
        (
            "mid_block.resnets.1.time_emb_proj.weight",
            "middle_block.2.emb_layers.1.weight",
        ),
        ("conv_norm_out.bias", "out.0.bias"),
    ] {
        assert_eq!(sd15.unet[name], unet(ldm), "{name}");
    }
    assert_eq!(
        sd15.vae["decoder.up_blocks.0.resnets.0.conv1.weight"],
        whole("first_stage_model.decoder.up.3.block.0.conv1.weight")
    );
    assert_eq!(
        sd15.vae["encoder.mid_block.attentions.0.to_out.0.weight"],
        Take::View {
            source: "first_stage_model.encoder.mid.attn_1.proj_out.weight".into(),
            rows: None,
            shape: Some(vec![512, 512]),
        }
    );
    let sd21 = plan(&shapes("sd21")).expect("sd21");
    assert!(
        sd21.text
            .contains_key("text_model.encoder.layers.22.mlp.fc2.weight")
    );
    assert!(!sd21.text.keys().any(|k| k.contains(".layers.23.")));
    assert_eq!(
        sd21.text["text_model.encoder.layers.22.self_attn.v_proj.weight"],
        Take::View {
            source: "cond_stage_model.model.transformer.resblocks.22.attn.in_proj_weight".into(),
            rows: Some(2048..3072),
            shape: None,
        }
    );
    let sdxl = plan(&shapes("sdxl")).expect("sdxl");
    assert_eq!(
        sdxl.unet["add_embedding.linear_2.bias"],
        unet("label_emb.0.2.bias")
    );
    assert_eq!(
        sdxl.text_2.as_ref().expect("text 2")["text_projection.weight"],
        Take::Transposed {
            source: "conditioner.embedders.1.model.text_projection".into()
        }
    );
}

/// Name, shape and values (zeros when None) of an F32 tensor.
type Spec<'a> = (&'a str, &'a [usize], Option<&'a [f32]>);

fn write_file(path: &Path, tensors: &[Spec<'_>]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let n: usize = shape.iter().product();
        let start = data.len();
        match values {
            Some(v) => data.extend(v.iter().flat_map(|x| x.to_le_bytes())),
            None => data.resize(start + 4 * n, 0),
        }
        let info = json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]});
        header.insert((*name).to_owned(), info);
    }
    let header = serde_json::to_vec(&header).expect("header");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend(data);
    std::fs::write(path, bytes).expect("write");
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("single-file-{}-{name}", std::process::id()))
}

#[test]
fn views_rows_and_transposes() {
    let path = temp("views.safetensors");
    let values: Vec<f32> = (0..12).map(|i| i as f32).collect();
    write_file(
        &path,
        &[("w", &[6, 2], Some(&values)), ("p", &[3, 4], Some(&values))],
    );
    let file = SafeTensors::open_files(std::slice::from_ref(&path)).expect("open");
    let mut part = Part::new();
    let rows = Take::View {
        source: "w".into(),
        rows: Some(2..4),
        shape: Some(vec![4]),
    };
    part.insert("k".into(), rows);
    part.insert("t".into(), Take::Transposed { source: "p".into() });
    let table = derive(&file, &part).expect("derive");
    drop(file);
    let k = table.get("k").expect("k");
    assert_eq!((k.shape, k.to_f32()), (&[4][..], vec![4.0, 5.0, 6.0, 7.0]));
    let t = table.get("t").expect("t");
    assert_eq!(t.shape, &[4, 3]);
    assert_eq!(
        t.to_f32(),
        [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn foreign_and_broken_files_are_clear_errors() {
    let cases: [(&str, &[&str], &str); 6] = [
        (
            "flux",
            &["double_blocks.0.img_attn.norm.key_norm.scale"],
            "Flux",
        ),
        (
            "sd3",
            &["model.diffusion_model.joint_blocks.0.context_block.adaLN_modulation.1.bias"],
            "SD3",
        ),
        (
            "lora",
            &["lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"],
            "LoRA",
        ),
        (
            "vae",
            &["encoder.down.0.block.0.conv1.weight"],
            "standalone VAE",
        ),
        (
            "other",
            &["model.layers.0.mlp.up_proj.weight"],
            "none of their tensor names",
        ),
        (
            "no-vae",
            &[
                "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
                "model.diffusion_model.input_blocks.0.0.weight",
            ],
            "no VAE",
        ),
    ];
    for (name, keys, expected) in cases {
        let path = temp(&format!("{name}.safetensors"));
        let tensors: Vec<Spec<'_>> = keys.iter().map(|k| (*k, &[2usize][..], None)).collect();
        write_file(&path, &tensors);
        let message = match open_single_file(&path) {
            Ok(_) => panic!("{name} opened"),
            Err(e) => e.to_string(),
        };
        assert!(
            message.contains("not a Stable Diffusion 1.x/2.x/XL checkpoint")
                && message.contains(expected)
                && message.contains(&*path.to_string_lossy()),
            "{name}: {message}"
        );
        let _ = std::fs::remove_file(path);
    }
    let path = temp("garbage.safetensors");
    std::fs::write(&path, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a checkpoint").expect("write");
    let message = open_single_file(&path).err().map(|e| e.to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("corrupt safetensors")),
        "{message:?}"
    );
    let _ = std::fs::remove_file(path);
}

/// `got` holds `want`'s values: the same bytes, or `want` rounded to `got`'s narrower dtype.
fn same_values(name: &str, got: TensorView<'_>, want: TensorView<'_>) {
    assert_eq!(got.shape, want.shape, "{name}");
    if got.dtype == want.dtype {
        assert!(got.bytes == want.bytes, "{name}: bytes differ");
        return;
    }
    let round = |x: f32| match got.dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F32 | DType::U8 => x,
    };
    let want: Vec<f32> = want.to_f32().into_iter().map(round).collect();
    assert!(got.to_f32() == want, "{name}: values differ");
}

/// Single files written from the tiny diffusers folders by
/// tests/reference/diffusers_to_single_file.py hold every tensor of the folder.
#[test]
fn tiny_checkpoints_hold_the_diffusers_tensors() {
    let models = fixtures().join("models");
    for (name, family) in [("tiny-sd", Family::Sd1), ("tiny-sdxl", Family::Sdxl)] {
        let file = open_single_file(&models.join(format!("{name}.safetensors"))).expect(name);
        assert_eq!(file.family, family);
        let folder = models.join(name);
        let mut parts = vec![
            ("unet", &file.unet, &file.unet_config, unet_fields()),
            ("vae", &file.vae, &file.vae_config, vae_fields()),
            (
                "text_encoder",
                &file.text_encoder,
                &file.text_encoder_config,
                clip_fields(),
            ),
        ];
        if let (Some(t), Some(c)) = (&file.text_encoder_2, &file.text_encoder_2_config) {
            let mut fields = clip_fields();
            fields.push(("projection_dim", Value::Null));
            parts.push(("text_encoder_2", t, c, fields));
        }
        assert_eq!(parts.len(), if family == Family::Sdxl { 4 } else { 3 });
        for (part, table, config, fields) in parts {
            let dir = folder.join(part);
            let stem = if part.starts_with("text") {
                "model"
            } else {
                "diffusion_pytorch_model"
            };
            let reference =
                SafeTensors::open_files(&[dir.join(format!("{stem}.safetensors"))]).expect(part);
            let mut count = 0;
            for tensor in reference.names() {
                let got = table.get(tensor).expect(tensor);
                same_values(tensor, got, reference.get(tensor).expect(tensor));
                count += 1;
            }
            assert_eq!(count, table.names().count(), "{name} {part}: extra tensors");
            let released = crate::load::read_json(&dir.join("config.json")).expect("config");
            agree(&format!("{name} {part}"), config, &released, &fields);
        }
        // What the tiny models share with the released ones.
        agree(
            name,
            &file.vae_config,
            &crate::load::read_json(&folder.join("vae/config.json")).expect("vae"),
            &[
                ("norm_num_groups", Value::Null),
                ("scaling_factor", Value::Null),
            ],
        );
        agree(
            name,
            &file.unet_config,
            &crate::load::read_json(&folder.join("unet/config.json")).expect("unet"),
            &[("norm_num_groups", Value::Null)],
        );
    }
}
