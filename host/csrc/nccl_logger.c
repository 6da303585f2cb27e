/* The logger rustccl hands to NCCL C plugins. NCCL's ncclDebugLogger_t is a C variadic
 * function (level, flags, file, line, fmt, ...); stable Rust cannot define one, so this file
 * formats the message and passes the finished line to rustccl_c_plugin_log_line (Rust). */
#include <stdarg.h>
#include <stdio.h>

void rustccl_c_plugin_log_line(int level, unsigned long flags, const char *file, int line, const char *msg);

void rustccl_c_plugin_logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  if (fmt == NULL) return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  rustccl_c_plugin_log_line(level, flags, file, line, buf);
}
