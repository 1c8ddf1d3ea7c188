//! `sqdisc-sim`: the software HCA as an RDMA device that unmodified verbs programs use, across processes.
//!
//! `sqdisc-sim run -- ib_write_bw` starts the device daemon if none is running and runs the program with the
//! preload library, which makes libibverbs' device list show the daemon's device. `start`, `stop`, `status`
//! and `report` manage the daemon; `daemon` is the daemon itself, in the foreground. docs/sim.md, "Running
//! unmodified programs", has the whole story.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod client;
mod cm;
mod control;
mod memory;
mod requests;
mod server;
mod sys;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// The node GUID the device reports (its port GID is derived from it).
pub const NODE_GUID: u64 = 0x0002_c903_0053_5153;

#[derive(Parser)]
#[command(name = "sqdisc-sim", version, about = "The sqdisc software HCA as an RDMA device for unmodified programs, across processes")]
struct Cli {
    /// The daemon's socket (default: $XDG_RUNTIME_DIR/sqdisc-sim/socket, else /tmp/sqdisc-sim-<uid>/socket).
    #[arg(long, global = true, env = "SQDISC_SIM_SOCKET")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program on the device: start the daemon if none is running (with these settings), then run the
    /// program with the preload library.
    Run {
        #[command(flatten)]
        settings: Settings,
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        program: Vec<String>,
    },
    /// Start the daemon in the background.
    Start {
        #[command(flatten)]
        settings: Settings,
    },
    /// Stop the daemon (it prints its violation log to its log file as it goes).
    Stop,
    /// Show the daemon's settings, clock and clients.
    Status,
    /// Print the violation log: which process, QP and WQE broke which rule. Exits 3 when there is any.
    Report,
    /// Make connected QPs of a process fatal now (a fault in the middle of a run); exits 1 when it has none.
    FailQps {
        /// The process whose QPs fail.
        #[arg(long)]
        pid: u32,
        /// At most this many, lowest QP number first.
        #[arg(long, default_value_t = 1)]
        max: u32,
    },
    /// Be the daemon, in the foreground (what `start` runs).
    Daemon {
        #[command(flatten)]
        settings: Settings,
    },
}

/// How the device behaves; each has an environment variable too.
#[derive(Args, Clone, Copy, Debug)]
pub struct Settings {
    /// The seed of every random choice (loss, wire delay).
    #[arg(long, env = "SQDISC_SIM_SEED", default_value_t = 1)]
    seed: u64,
    /// Request packets lost on the wire, per million.
    #[arg(long, env = "SQDISC_SIM_LOSS_PPM", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    loss_ppm: u32,
    /// Response packets (ACKs, NAKs, READ and atomic responses) lost, per million.
    #[arg(long, env = "SQDISC_SIM_ACK_LOSS_PPM", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    ack_loss_ppm: u32,
    /// Steps without acknowledgement progress before the requester retransmits.
    #[arg(long, env = "SQDISC_SIM_RETRANS_TIMEOUT", default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    retrans_timeout: u32,
    /// Steps a requester waits after an RNR NAK.
    #[arg(long, env = "SQDISC_SIM_RNR_DELAY", default_value_t = 8)]
    rnr_delay: u32,
    /// Log a post into a full SQ or RQ as a violation too.
    #[arg(long, env = "SQDISC_SIM_STRICT")]
    strict: bool,
    /// Arming a CQ that holds unpolled CQEs raises its completion event at once, as ConnectX HCAs do (without
    /// it, only a CQE added after the arm fires: IBA's rule, and rxe's and siw's).
    #[arg(long, env = "SQDISC_SIM_ARM_PENDING")]
    arm_pending: bool,
    /// Microseconds of wall time per step while something is in flight and no program polls.
    #[arg(long, env = "SQDISC_SIM_TICK_US", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    tick_us: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let socket = cli.socket.unwrap_or_else(sqdisc_sim_proto::socket_path);
    let result = match cli.command {
        Command::Run { settings, program } => control::run(&socket, settings, &program),
        Command::Start { settings } => control::start(&socket, settings).map(|pid| {
            println!("sqdisc-sim: daemon running (pid {pid}) on {}", socket.display());
            ExitCode::SUCCESS
        }),
        Command::Stop => control::stop(&socket),
        Command::Status => control::status(&socket),
        Command::Report => control::report(&socket),
        Command::FailQps { pid, max } => control::fail_qps(&socket, pid, max),
        Command::Daemon { settings } => control::daemon(&socket, settings),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("sqdisc-sim: {message}");
            ExitCode::FAILURE
        }
    }
}
