// Generates the gRPC code from proto/lockstep.proto at build time (nothing generated is
// committed). Needs `protoc` (Debian: protobuf-compiler); the README's set-up installs it.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/lockstep.proto");
    tonic_prost_build::configure().compile_protos(&["proto/lockstep.proto"], &["proto"])?;
    Ok(())
}
