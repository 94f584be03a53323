/* The pod sandbox's process: sleeps until a signal ends it, and reaps the
 * children it inherits as PID 1 of the pod. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { _exit(128 + sig); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction quit_action = {.sa_handler = quit};
    struct sigaction reap_action = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &quit_action, NULL) < 0 || sigaction(SIGTERM, &quit_action, NULL) < 0 ||
        sigaction(SIGCHLD, &reap_action, NULL) < 0)
        return 1;
    for (;;)
        pause();
}
