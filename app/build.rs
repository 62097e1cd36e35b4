//! Windows builds: the application icon and version information in the .exe's resources,
//! compiled by the MinGW toolchain's `windres` and linked into the binary. Done by hand because
//! it is one call to the tool the cross-linker ships with; nothing happens for other targets.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../assets/icons/backpack.ico");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("windows")
        || std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("gnu")
    {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let icon = manifest.join("../assets/icons/backpack.ico");
    let version = std::env::var("CARGO_PKG_VERSION").expect("version");
    let mut parts: Vec<u16> = version
        .split(['.', '-', '+'])
        .filter_map(|p| p.parse().ok())
        .collect();
    parts.resize(4, 0);
    let numeric = format!("{},{},{},{}", parts[0], parts[1], parts[2], parts[3]);
    let rc = format!(
        r#"1 ICON "{icon}"
1 VERSIONINFO
FILEVERSION {numeric}
PRODUCTVERSION {numeric}
FILEOS 0x40004
FILETYPE 0x1
BEGIN
  BLOCK "StringFileInfo"
  BEGIN
    BLOCK "040904B0"
    BEGIN
      VALUE "CompanyName", "Backpack developers"
      VALUE "FileDescription", "Backpack: run AI models locally on any GPU"
      VALUE "FileVersion", "{version}"
      VALUE "InternalName", "backpack"
      VALUE "OriginalFilename", "backpack.exe"
      VALUE "ProductName", "Backpack"
      VALUE "ProductVersion", "{version}"
    END
  END
  BLOCK "VarFileInfo"
  BEGIN
    VALUE "Translation", 0x409, 1200
  END
END
"#,
        icon = icon.display().to_string().replace('\\', "/"),
    );
    let rc_path = out.join("backpack.rc");
    std::fs::write(&rc_path, rc).expect("writing backpack.rc");
    let object = out.join("backpack-resources.o");
    let windres = std::env::var("WINDRES").unwrap_or_else(|_| "x86_64-w64-mingw32-windres".into());
    let status = Command::new(&windres)
        .arg(&rc_path)
        .arg("-O")
        .arg("coff")
        .arg("-o")
        .arg(&object)
        .status()
        .unwrap_or_else(|e| panic!("running {windres} (MinGW-w64's binutils): {e}"));
    assert!(
        status.success(),
        "{windres} failed on {}",
        rc_path.display()
    );
    println!("cargo:rustc-link-arg-bins={}", object.display());
}
