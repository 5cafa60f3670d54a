/*
 * nf-lock: POSIX record locks from the guest's shell scripts (busybox has no fcntl).
 *
 *   nf-lock FILE test rd|wr START LEN   fcntl(F_GETLK): prints "unlck", or the lock in
 *                                        the way as "rdlck|wrlck START LEN PID"
 *   nf-lock FILE hold rd|wr START LEN   fcntl(F_SETLK): prints "held PID", then keeps
 *                                        the lock until killed
 *
 * LEN 0 means to end of file, as in struct flock. Exit status 0; 1 with the reason on
 * stderr if a call fails; 2 for bad usage. Built static by tests/guest/build-guest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(void)
{
	fputs("usage: nf-lock FILE test|hold rd|wr START LEN\n", stderr);
	return 2;
}

static int fail(const char *what, const char *file)
{
	fprintf(stderr, "nf-lock: %s %s: %s\n", what, file, strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 6)
		return usage();
	const char *file = argv[1], *cmd = argv[2], *type = argv[3];
	int hold = strcmp(cmd, "hold") == 0;
	if (!hold && strcmp(cmd, "test") != 0)
		return usage();
	struct flock fl = { .l_whence = SEEK_SET };
	if (strcmp(type, "rd") == 0)
		fl.l_type = F_RDLCK;
	else if (strcmp(type, "wr") == 0)
		fl.l_type = F_WRLCK;
	else
		return usage();
	fl.l_start = strtoll(argv[4], NULL, 10);
	fl.l_len = strtoll(argv[5], NULL, 10);

	/* A write lock needs a file open for writing; a test needs no access at all. */
	int fd = open(file, hold && fl.l_type == F_WRLCK ? O_RDWR : O_RDONLY);
	if (fd < 0)
		return fail("open", file);
	if (!hold) {
		if (fcntl(fd, F_GETLK, &fl) < 0)
			return fail("fcntl(F_GETLK)", file);
		if (fl.l_type == F_UNLCK)
			puts("unlck");
		else
			printf("%s %lld %lld %d\n", fl.l_type == F_WRLCK ? "wrlck" : "rdlck",
			       (long long)fl.l_start, (long long)fl.l_len, (int)fl.l_pid);
		return 0;
	}
	if (fcntl(fd, F_SETLK, &fl) < 0)
		return fail("fcntl(F_SETLK)", file);
	printf("held %d\n", (int)getpid());
	fflush(stdout);
	for (;;)
		pause();
}
