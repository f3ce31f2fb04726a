//! `cuda-probe` exports its own `ioctl` so that libcuda's calls (dlopen'ed, resolved through the
//! global scope, the executable first) reach its recorder; an executable's symbols are not in the
//! dynamic symbol table unless asked for.
fn main() {
    println!("cargo:rustc-link-arg-bin=cuda-probe=-Wl,--export-dynamic-symbol=ioctl");
}
