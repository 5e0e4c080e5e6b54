//! `bench-ycsb`: see [`bench_ycsb::cli`] and `bench-ycsb --help`.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(bench_ycsb::cli::main(std::env::args_os()))
}
