/* The tools' exit check of stdout (zt_output.h). */
#include "zt_output.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *output_tool = "zoffload";

/* ferror catches an earlier failed write whose errno is gone; fclose the
 * final flush. */
static void close_stdout(void)
{
    int had_error = ferror(stdout);
    errno = 0;
    int closed = fclose(stdout) == 0;
    if (closed && !had_error)
        return;
    int e = errno;
    fprintf(stderr, "%s: cannot write the output to stdout%s%s; the results are lost\n",
            output_tool, e ? ": " : "", e ? strerror(e) : "");
    _exit(1);
}

void zt_output_check_at_exit(const char *tool)
{
    static int registered;
    output_tool = tool;
    if (!registered && atexit(close_stdout) == 0)
        registered = 1;
}
