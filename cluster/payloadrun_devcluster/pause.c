/* The pod sandbox's process: holds the pod's namespaces, reaps orphans, exits on SIGINT/SIGTERM.
 * Built static (gcc -static) by payloadrun_devcluster.images into a one-layer image, so the node
 * needs no registry for its sandbox image. Same behaviour as Kubernetes' own pause. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) { _exit(signo == SIGINT || signo == SIGTERM ? 0 : 1); }

static void reap(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
      sigaction(SIGCHLD, &on_child, NULL) < 0) {
    return 1;
  }
  for (;;) {
    pause();
  }
  return 42;
}
