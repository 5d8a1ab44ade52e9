/*
 * commands.h - the subcommands of `zs`. Each takes (argc, argv) with
 * argv[0] the command name and returns the exit status (2 for bad usage).
 */
#ifndef ZS_APPS_COMMANDS_H
#define ZS_APPS_COMMANDS_H

int cmd_sysinfo(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_ops(int argc, char **argv);

#endif
