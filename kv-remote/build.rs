//! Generates the `kvsds.control.v1` messages and service from the .proto
//! file (needs `protoc`: Debian's `protobuf-compiler`, or `PROTOC`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/kvsds/control/v1/control.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/kvsds/control/v1/control.proto"], &["proto"])?;
    Ok(())
}
