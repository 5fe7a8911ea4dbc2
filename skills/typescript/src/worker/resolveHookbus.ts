/**
 * A module resolve hook for the worker: the bare specifier `hookbus` always means this
 * package, so a skills file anywhere (with or without hookbus in a node_modules of its
 * own) shares the worker's Skill and HookError classes.
 */

let target = '';

export function initialize(data: { url: string }): void {
  target = data.url;
}

export async function resolve(
  specifier: string,
  context: unknown,
  next: (specifier: string, context: unknown) => Promise<unknown>,
): Promise<unknown> {
  if (specifier === 'hookbus') return { url: target, shortCircuit: true, format: 'module' };
  return next(specifier, context);
}
