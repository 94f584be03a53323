//! Entry point: the CNI plugin when `CNI_COMMAND` is set (and non-empty), otherwise
//! the subcommands (`daemon`, `status`, `version`).

fn main() {
    std::process::exit(podnet::run());
}
