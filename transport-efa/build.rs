//! Generates the libfabric bindings from the system headers.
//!
//! libfabric implements most of its API as `static inline` functions that dispatch through
//! provider ops tables; bindgen's `wrap_static_fns` emits a small C file with real symbols for
//! them, which we compile and link here. The header version becomes `fi_X_Y` cfgs so newer
//! symbols can be gated (Debian 12 ships 1.17; EFA hosts run 1.18 to 2.x).
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=ffi/wrapper.h");
    let lib = pkg_config::Config::new().atleast_version("1.17").probe("libfabric").unwrap_or_else(|e| {
        panic!("libfabric >= 1.17 headers not found ({e}); on Debian: apt-get install libfabric-dev")
    });

    let mut parts = lib.version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(1), parts.next().unwrap_or(0));
    // Emit one cfg per known minor so code can say #[cfg(fi_1_18)] for "1.18 or newer".
    let known =
        [(1, 17), (1, 18), (1, 19), (1, 20), (1, 21), (1, 22), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4)];
    for (ma, mi) in known {
        println!("cargo::rustc-check-cfg=cfg(fi_{ma}_{mi})");
        if (major, minor) >= (ma, mi) {
            println!("cargo:rustc-cfg=fi_{ma}_{mi}");
        }
    }
    println!("cargo:rustc-env=RDMALANE_FI_HEADER_VERSION={}", lib.version);

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let wrappers = out.join("fi_static_wrappers");
    let mut builder = bindgen::Builder::default()
        .header("ffi/wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*")
        .allowlist_type("fid.*")
        .allowlist_var("FI_.*")
        .allowlist_var("FID_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for p in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", p.display()));
    }
    builder
        .generate()
        .expect("bindgen failed on the libfabric headers")
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");

    let mut cc = cc::Build::new();
    cc.file(wrappers.with_extension("c"))
        .include(env::var("CARGO_MANIFEST_DIR").unwrap())
        .flag("-include")
        .flag("ffi/wrapper.h")
        .warnings(false);
    for p in &lib.include_paths {
        cc.include(p);
    }
    cc.compile("rdmalane_fi_wrappers");
}
