"""Declared C types of kernel globals that Volatility reads through `object_from_symbol`.

Kernel BTF describes every type but, by default, only per-CPU variables (pahole encodes other
globals only with `--btf_features=global_var`, newer than most distro kernels). A symbol without
a type is fine for addresses, but Volatility's Linux plugins instantiate some globals directly
(`init_task` for the task list, `init_files` for KASLR, `modules`, `prb`, ...), so zen gives
those the type their kernel source declares. A declaration is used only when the type it names
exists in the kernel's BTF (a kernel version without that struct simply leaves the symbol untyped).

The form is a C declaration without the variable name: `struct task_struct`, `char[]` (an
array whose length the declaration does not say: count 0, as dwarf2json writes it),
`struct printk_ringbuffer *`, `unsigned long`, `struct gate_struct[256]`. Two extensions:
`struct {seq; timekeeper}` is the anonymous struct with exactly these members (a static variable
of an unnamed type, which BTF keeps but cannot name), and `[?]` an array whose length is a
kernel-config constant that BTF does not record: it is measured in the kernel image's data by
the entry test in `MEASURED_ARRAYS` (entries are counted while the test holds).
"""

from __future__ import annotations

KERNEL_GLOBALS: dict[str, str] = {
    # identity, layout and boundaries of the kernel image
    "linux_banner": "char[]",
    "linux_proc_banner": "char[]",
    "_text": "char[]",
    "_stext": "char[]",
    "_etext": "char[]",
    "_sdata": "char[]",
    "_edata": "char[]",
    "_end": "char[]",
    "__bss_start": "char[]",
    "__start___tracepoints_ptrs": "int[]",
    "init_uts_ns": "struct uts_namespace",
    "init_top_pgt": "pgd_t[512]",
    "swapper_pg_dir": "pgd_t[512]",
    "page_offset_base": "unsigned long",
    "vmalloc_base": "unsigned long",
    "vmemmap_base": "unsigned long",
    "phys_base": "unsigned long",
    "vm_kernel_stext": "unsigned long",
    "vm_kernel_etext": "unsigned long",
    "mem_map": "struct page *",
    "max_pfn": "unsigned long",
    "cap_last_cap": "int",
    # the kallsyms tables (located by zen in the image; Volatility's linux.kallsyms reads them)
    "kallsyms_num_syms": "unsigned int",
    "kallsyms_names": "unsigned char[]",
    "kallsyms_markers": "unsigned int[]",
    "kallsyms_seqs_of_names": "unsigned char[]",
    "kallsyms_token_table": "char[]",
    "kallsyms_token_index": "unsigned short[]",
    "kallsyms_offsets": "int[]",
    "kallsyms_relative_base": "unsigned long",
    "__start___ksymtab": "struct kernel_symbol[]",
    "__stop___ksymtab": "struct kernel_symbol[]",
    "__start___ksymtab_gpl": "struct kernel_symbol[]",
    "__stop___ksymtab_gpl": "struct kernel_symbol[]",
    "__stop___tracepoints_ptrs": "int[]",
    "_sinittext": "char[]",
    "_einittext": "char[]",
    "bpf_tree": "struct latch_tree_root",
    "bpf_kallsyms": "struct list_head",
    "map_idr": "struct idr",
    "ftrace_ops_trampoline_list": "struct list_head",
    "sys_call_table": "sys_call_ptr_t[]",
    "idt_descr": "struct desc_ptr",
    "iomem_resource": "struct resource",
    "ioport_resource": "struct resource",
    "mem_section": "struct mem_section **",
    "node_data": "pg_data_t *[]",
    # processes, memory, files
    "init_task": "struct task_struct",
    "init_mm": "struct mm_struct",
    "init_files": "struct files_struct",
    "init_fs": "struct fs_struct",
    "init_pid_ns": "struct pid_namespace",
    "init_nsproxy": "struct nsproxy",
    "init_cred": "struct cred",
    "init_user_ns": "struct user_namespace",
    "init_ipc_ns": "struct ipc_namespace",
    "init_cgroup_ns": "struct cgroup_namespace",
    "init_time_ns": "struct time_namespace",
    "nr_threads": "int",
    "total_forks": "unsigned long",
    "pid_max": "int",
    "super_blocks": "struct list_head",
    "mount_hashtable": "struct hlist_head *",
    "mountpoint_hashtable": "struct hlist_head *",
    "proc_root": "struct proc_dir_entry",
    "sysctl_table_root": "struct ctl_table_root",
    "shadow_timekeeper": "struct timekeeper",
    # modules and kernel objects
    "modules": "struct list_head",
    "module_kset": "struct kset *",
    "mod_tree": "struct mod_tree_root",
    "module_addr_min": "unsigned long",
    "module_addr_max": "unsigned long",
    "prog_idr": "struct idr",
    "ftrace_ops_list": "struct ftrace_ops *",
    "ftrace_list_end": "struct ftrace_ops",
    "ftrace_mod_maps": "struct list_head",
    # networking, devices, notifiers
    "net_namespace_list": "struct list_head",
    "init_net": "struct net",
    "tty_drivers": "struct list_head",
    "keyboard_notifier_list": "struct atomic_notifier_head",
    "socket_file_ops": "struct file_operations",
    "sockfs_dentry_operations": "struct dentry_operations",
    "registered_fb": "struct fb_info *[32]",
    "num_registered_fb": "int",
    "idt_table": "struct gate_struct[256]",
    "arp_seq_ops": "struct seq_operations",
    "packet_seq_ops": "struct seq_operations",
    "raw_seq_ops": "struct seq_operations",
    "raw6_seq_ops": "struct seq_operations",
    "tcp4_seq_ops": "struct seq_operations",
    "tcp6_seq_ops": "struct seq_operations",
    "udp_seq_ops": "struct seq_operations",
    "udp6_seq_ops": "struct seq_operations",
    "unix_seq_ops": "struct seq_operations",
    "tcp4_seq_afinfo": "struct tcp_seq_afinfo",
    "tcp6_seq_afinfo": "struct tcp_seq_afinfo",
    "udp4_seq_afinfo": "struct udp_seq_afinfo",
    "udp6_seq_afinfo": "struct udp_seq_afinfo",
    "udplite4_seq_afinfo": "struct udp_seq_afinfo",
    "udplite6_seq_afinfo": "struct udp_seq_afinfo",
    # kernel log and time
    "prb": "struct printk_ringbuffer *",
    "printk_rb_static": "struct printk_ringbuffer",
    "log_buf": "char *",
    "log_buf_len": "unsigned int",
    "log_first_idx": "unsigned int",
    "log_next_idx": "unsigned int",
    "wall_to_monotonic": "struct timespec64",
    "total_sleep_time": "struct timespec64",
    "tk_core": "struct {seq; timekeeper}",
    "taint_flags": "struct taint_flag[?]",
    "jiffies": "unsigned long",
    "jiffies_64": "unsigned long long",
    "boot_command_line": "char[]",
    "saved_command_line": "char *",
}


def _taint_flag_entry(entry: bytes) -> bool:
    """struct taint_flag {char c_true; char c_false; bool module; ...}: 'P','G',1 / 'F',' ',1 ..."""
    return 0x41 <= entry[0] <= 0x5A and 0x20 <= entry[1] <= 0x7E and entry[2] in (0, 1)


# symbol -> test of one array entry's bytes, for the `[?]` declarations above
MEASURED_ARRAYS = {"taint_flags": _taint_flag_entry}
MAX_MEASURED = 256
