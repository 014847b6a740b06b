// The interpreter's context switch on x86-64 (System V): saves the callee-saved registers, MXCSR
// and the x87 control word on the current stack, stores the stack pointer through the first
// argument and continues on the stack the second names. No system call (glibc's swapcontext
// saves the signal mask with one on every switch).
        .text
        .globl  ablate_emu_switch
        .type   ablate_emu_switch, @function
// void ablate_emu_switch(void** save_sp, void* load_sp)
ablate_emu_switch:
        .cfi_startproc
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $8, %rsp
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .cfi_endproc
        .size   ablate_emu_switch, .-ablate_emu_switch

// A new fiber's first return lands here: r12 holds its argument, r13 its entry function, which
// never returns (it switches away for the last time).
        .globl  ablate_emu_trampoline
        .type   ablate_emu_trampoline, @function
ablate_emu_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        movq    %r12, %rdi
        andq    $-16, %rsp
        callq   *%r13
        ud2
        .cfi_endproc
        .size   ablate_emu_trampoline, .-ablate_emu_trampoline

        .section .note.GNU-stack,"",@progbits
