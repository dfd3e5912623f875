import type { AppModule } from '../app-module.js'
import { resourceModule } from '../resource-module.js'
import { products } from './resource.js'

/** The product catalogue: a resource and nothing else. */
export const productsModule: AppModule = { name: 'products', resources: [resourceModule(products)] }
