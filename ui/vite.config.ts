import { fileURLToPath } from 'node:url';
import vue from '@vitejs/plugin-vue';
import { defineConfig } from 'vitest/config';

// `vite build` builds the test harness (harness/) into dist/ with relative
// paths, so it can be served under any prefix. `vitest` runs test/.
export default defineConfig({
  plugins: [vue()],
  root: fileURLToPath(new URL('./harness', import.meta.url)),
  base: './',
  build: {
    outDir: fileURLToPath(new URL('./dist', import.meta.url)),
    emptyOutDir: true,
  },
  test: {
    root: fileURLToPath(new URL('.', import.meta.url)),
    include: ['test/**/*.test.ts'],
    environment: 'happy-dom',
  },
});
