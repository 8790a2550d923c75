// Types of scripts/build.mjs, for the tests that import it.
export declare const root: string
export declare const distDir: string
export declare const stampName: string
export declare function sourceStamp(dir?: string): string
export declare function distIsFresh(): boolean
export declare function distPjson(): Record<string, unknown>
export declare function build(options?: {quiet?: boolean}): Promise<void>
