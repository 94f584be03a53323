# shellcheck shell=bash
# log_end LOG: the end of a component's log with repeats folded, as scripts/node's
# and scripts/cluster's failed waits show it: the last 30 distinct lines, each
# where it last came, with how often (a kubelet waiting for something repeats one
# error every 100 ms, and a plain tail would show only that). klog's time and PID
# prefix is not part of what makes two lines the same.
log_end() {
    awk '{ key = $0; sub(/^[IWEF][0-9]+ [0-9:.]+ +[0-9]+ /, "", key)
           count[key]++; last[key] = NR; line[key] = $0 }
         END { for (k in last) printf "%d\t%d\t%s\n", last[k], count[k], line[k] }' "$1" |
        sort -n | tail -n 30 | awk -F '\t' '{ print ($2 > 1 ? "(" $2 " times) " : "") $3 }'
}
